"""A stream restarted through another sink id while its old one decided a batch the
checkpoint has not recorded as complete is refused at its start, in every exactly-once
sink.

Found by probe: sink id A decided batch 1 and its driver died before applying it; the
query was restarted with ``sinkId`` B (or a table, key prefix or topic that derives
another id), and Spark replayed batch 1 through B; then restarted with A again, whose
recovery applied its decided batch 1 too. PostgreSQL (append) and Redis (increment) held
batch 1 twice; a Kafka sink's restart within the transaction timeout would commit it
twice. A driver that died after applying the batch, before Spark recorded it, had B
write all of it again at once. Now B's start is refused, naming A, the batch and what
to do; A's replay finishes the batch, and B then starts. The same for a sink id whose
bookkeeping names changed (schema, key prefix, transactional id prefix), and which batch
a checkpoint replays, on a local disk and on HDFS; a Kafka sink switched to
``commitMode=task`` over a decision not yet committed, or read behind another client's
transaction on the marker log; and a Redis sink whose ``mode`` changed between a decision
and its replay, which applies the batch as it was decided; and an at-least-once start
that first settles what the sink id left in exactly-once. Cost: ~21 s (eighteen cases;
HDFS is the one CI starts for the system tier).
"""

from __future__ import annotations

import json
import pickle
import uuid
from dataclasses import replace
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter

from eos_connectors.core import faults
from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.protocol import TwoPhaseCommitWriter
from eos_connectors.core.sink_switch import SinkSwitchedMidBatchError
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.kafka import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter, PreparedTask
from eos_connectors.sinks.kafka.checks import start_checks
from eos_connectors.sinks.kafka.options import KafkaSinkOptions
from eos_connectors.sinks.postgres import PostgresDataSource
from eos_connectors.sinks.redis import RedisDataSource
from eos_connectors.testing import CONTRACT_SCHEMA
from tests.kafka_sink_util import a_task, read_written
from tests.upsert_util import STORES, upserted

pytestmark = pytest.mark.services

_ARROW = pa.schema([pa.field("word", pa.string()), pa.field("n", pa.int64())])


#: Where the sink's driver died in batch 1's commit: before applying it, or after.
CRASHES = ["after-decision", "after-commit"]


def _checkpoint(tmp_path: Path, query: str) -> str:
    """A checkpoint folder as Spark leaves it when batch 1 failed: the query id in
    ``metadata``, batch 0 planned and completed, batch 1 planned only."""
    (tmp_path / "metadata").write_text(json.dumps({"id": query}))
    for log, batches in (("offsets", (0, 1)), ("commits", (0,))):
        (tmp_path / log).mkdir()
        for batch in batches:
            (tmp_path / log / str(batch)).write_text("v1\n{}\n")
    return str(tmp_path)


def _source(store: str, endpoints: Endpoints, name: str, **options: str) -> DataSource:
    """The store's format writing ``word`` -> ``n`` into table or key prefix ``name``, in
    a mode where a record written twice shows (PostgreSQL appends, Redis increments)."""
    if store == "postgres":
        return PostgresDataSource(
            {"dsn": endpoints.postgres_dsn, "table": name, "createTable": "true", **options}
        )
    return RedisDataSource(
        {"url": endpoints.redis_url, "keyPrefix": f"{name}:", "keyColumn": "word"}
        | {"valueColumns": "n", "mode": "increment", **options}
    )


def _counts(store: str, endpoints: Endpoints, name: str) -> dict[str, int]:
    """Word -> how many times it was written (rows appended, or increments added)."""
    if store == "redis":
        return upserted(store, endpoints, name)
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(f'SELECT word, count(*) FROM "{name}" GROUP BY word').fetchall()
    return {str(word): int(n) for word, n in rows}


def _completed(checkpoint: str, batch: int) -> None:
    """Spark records ``batch`` as complete once its sink's commit returned."""
    (Path(checkpoint) / "commits" / str(batch)).write_text("v1\n{}\n")


def _batch(
    writer: TwoPhaseCommitWriter, query: str, batch: int, run: str, n: int = 1, word: str = ""
) -> list[object]:
    """Batch ``batch``'s two tasks, prepared as Spark's tasks would: ``w<batch>-<p>`` = n
    (``<word>-<p>`` when ``word`` is given: the same keys in every batch)."""
    units: list[object] = []
    for partition in range(2):
        task = TaskIdentity(query, None, run, batch, partition, batch * 10 + partition)
        key = f"{word or f'w{batch}'}-{partition}"
        rows = pa.RecordBatch.from_pydict({"word": [key], "n": [n]}, _ARROW)
        shipped: TwoPhaseCommitWriter = pickle.loads(pickle.dumps(writer))
        units.append(shipped.prepare_task(task, iter([rows])))
    return units


@pytest.mark.cost(1)
@pytest.mark.parametrize("crash", CRASHES)
@pytest.mark.parametrize("store", STORES)
def test_a_stream_restarted_through_another_sink_id_mid_batch_is_refused(
    endpoints: Endpoints, unique: str, store: str, crash: str, tmp_path: Path
) -> None:
    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path, query)
    name = f"switch_{unique}_{store}_{crash.replace('-', '_')}"

    def writer(sink_id: str) -> TwoPhaseCommitWriter:
        source = _source(store, endpoints, name, sinkId=sink_id, checkpointLocation=checkpoint)
        made = source.streamWriter(CONTRACT_SCHEMA, False)
        assert isinstance(made, TwoPhaseCommitWriter)
        return made

    old, new = f"{name}-a", f"{name}-b"
    first = writer(old)
    first.commit(_batch(first, query, 0, "run-1"), 0)  # type: ignore[arg-type]
    with pytest.raises(faults.SimulatedCrash), faults.simulate(f"{crash}@1"):
        first.commit(_batch(first, query, 1, "run-1"), 1)  # type: ignore[arg-type]
    before = _counts(store, endpoints, name)

    with pytest.raises(SinkSwitchedMidBatchError, match=rf"sink '{old}' .* decided batch 1,"):
        writer(new)
    assert _counts(store, endpoints, name) == before, "the refused start wrote something"

    replay = writer(old)  # the old options again: Spark replays batch 1, its commit finishes
    replay.commit(_batch(replay, query, 1, "run-2"), 1)  # type: ignore[arg-type]
    _completed(checkpoint, 1)
    writer(new)  # the batch is complete: the switch is taken
    assert _counts(store, endpoints, name) == {f"w{b}-{p}": 1 for b in (0, 1) for p in (0, 1)}


def _switched(checkpoint: str, options: KafkaSinkOptions) -> list[bytes]:
    """Batch 1 completed in the checkpoint, the start with the new ``options`` taken; the
    Kafka sink's topic as a read_committed reader sees it, sorted."""
    _completed(checkpoint, 1)
    start_checks(options, {"checkpointLocation": checkpoint})
    assert options.topic is not None
    return sorted(r.value for r in read_written(options.kafka, options.topic))


@pytest.mark.cost(2)
@pytest.mark.parametrize("crash", CRASHES)
def test_a_kafka_stream_restarted_through_another_sink_id_mid_batch_is_refused(
    endpoints: Endpoints, batch_commit_options: KafkaSinkOptions, crash: str, tmp_path: Path
) -> None:
    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path, query)
    old = batch_commit_options
    assert old.sink_id is not None
    new = replace(old, sink_id=f"{old.sink_id}-b")
    raw = {"checkpointLocation": checkpoint}
    writer = BatchCommitWriter(old)

    def prepare(run: str) -> list[PreparedTask]:
        rows = pa.RecordBatch.from_pydict({"key": [b"k0", b"k1"], "value": [b"v0", b"v1"]})
        return [
            writer.write_task(a_task(1, run=run, partition=p, query=query), iter([rows]))
            for p in range(2)
        ]

    with pytest.raises(faults.SimulatedCrash), faults.simulate(f"{crash}@1"):
        writer.commit(list(prepare("run-1")), 1)
    with pytest.raises(SinkSwitchedMidBatchError, match=rf"sink '{old.sink_id}' .* batch 1,"):
        start_checks(new, raw)

    replay = prepare("run-2")
    assert {m.state for m in replay} == {"decided" if crash == "after-decision" else "marked"}
    writer.commit(list(replay), 1)
    assert _switched(checkpoint, new) == [b"v0", b"v0", b"v1", b"v1"]


@pytest.mark.cost(2)
def test_a_task_mode_switch_is_refused_behind_another_transaction_on_the_marker_log(
    endpoints: Endpoints, batch_commit_options: KafkaSinkOptions, tmp_path: Path
) -> None:
    """Sink id A in ``commitMode=task`` commits batch 1's markers while another client's
    transaction is open on the shared marker log (begun before them, so they sit past the
    log's last stable offset); the query restarts through B before Spark recorded batch 1.
    The switch check reads the marker groups, which hold A's markers as committed, and
    refuses: a read of the log's committed records alone found none, and let B write the
    batch again."""
    from confluent_kafka import Producer

    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path, query)
    old = replace(batch_commit_options, commit_mode="task")
    assert old.sink_id is not None
    new = replace(old, sink_id=f"{old.sink_id}-b")
    other = Producer({**endpoints.kafka, "transactional.id": f"other-{old.sink_id}"})
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(old.marker_log, b"a marker", b"another sink's task", partition=0)
    other.flush(30)
    try:
        writer = KafkaExactlyOnceWriter(old, checkpoint)
        rows = pa.RecordBatch.from_pydict({"key": [b"k"], "value": [b"v"]})
        for partition in range(2):
            task = a_task(1, run="run-1", partition=partition, query=query)
            assert not writer.write_task(task, iter([rows])).skipped
        with pytest.raises(SinkSwitchedMidBatchError, match=rf"sink '{old.sink_id}' .* batch 1,"):
            start_checks(new, {"checkpointLocation": checkpoint})
    finally:
        other.abort_transaction(30)


@pytest.mark.cost(2)
@pytest.mark.parametrize("crash", CRASHES)
def test_a_switch_to_commit_mode_task_before_a_decided_batch_is_committed_is_refused(
    endpoints: Endpoints, batch_commit_options: KafkaSinkOptions, crash: str, tmp_path: Path
) -> None:
    """The same sink id, ``commitMode`` changed from batch to task after batch 1 was
    decided. Its driver died before committing the decision's transactions
    (after-decision): a task-mode run has no driver to commit them, and its tasks would
    wait on them until the coordinator aborts them (15 minutes here), failing meanwhile;
    the start is refused, and in batch mode the replay commits the batch. Its driver
    committed them all (after-commit): the start goes on and the task-mode replay finds
    the batch written. Each record once either way."""
    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path, query)
    raw = {"checkpointLocation": checkpoint}
    batch_mode = batch_commit_options
    task_mode = replace(batch_mode, commit_mode="task")
    writer = BatchCommitWriter(batch_mode)

    def rows(batch: int) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"key": [b"k"], "value": [f"b{batch}".encode()]})

    def prepare(batch: int, run: str) -> list[PreparedTask]:
        return [
            writer.write_task(a_task(batch, run=run, partition=p, query=query), iter([rows(p)]))
            for p in range(2)
        ]

    start_checks(batch_mode, raw)
    with pytest.raises(faults.SimulatedCrash), faults.simulate(f"{crash}@1"):
        writer.commit(list(prepare(1, "run-1")), 1)
    if crash == "after-decision":
        with pytest.raises(SinkSwitchedMidBatchError, match=r"commitMode=batch .* \[0, 1\]"):
            start_checks(task_mode, raw)
        writer.commit(list(prepare(1, "run-2")), 1)  # the replay in batch mode commits it
    else:
        start_checks(task_mode, raw)
        task_writer = KafkaExactlyOnceWriter(task_mode, checkpoint)
        replay = [
            task_writer.write_task(
                a_task(1, run="run-2", partition=p, query=query), iter([rows(p)])
            )
            for p in range(2)
        ]
        assert all(report.skipped for report in replay), "the committed batch was written again"
    assert _switched(checkpoint, task_mode) == [b"b0", b"b1"]


@pytest.mark.cost(2)
def test_an_at_least_once_start_over_a_decided_kafka_batch_not_committed_is_refused(
    endpoints: Endpoints, batch_commit_options: KafkaSinkOptions, tmp_path: Path
) -> None:
    """As above for ``deliveryGuarantee=at-least-once``: the decided transactions would
    hold read_committed readers of its output back until the coordinator aborts them.
    Refused; the batch-commit replay commits the batch; then the switch is taken."""
    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path, query)
    raw = {"checkpointLocation": checkpoint}
    batch_mode = batch_commit_options
    at_least_once = replace(batch_mode, exactly_once=False)
    writer = BatchCommitWriter(batch_mode)
    rows = pa.RecordBatch.from_pydict({"key": [b"k"], "value": [b"v"]})

    def prepare(run: str) -> list[PreparedTask]:
        return [
            writer.write_task(a_task(1, run=run, partition=p, query=query), iter([rows]))
            for p in range(2)
        ]

    start_checks(batch_mode, raw)
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-decision@1"):
        writer.commit(list(prepare("run-1")), 1)
    with pytest.raises(SinkSwitchedMidBatchError, match=r"deliveryGuarantee=exactly-once"):
        start_checks(at_least_once, raw)
    writer.commit(list(prepare("run-2")), 1)
    assert _switched(checkpoint, at_least_once) == [b"v", b"v"]


#: Each store's bookkeeping option, and a value of it for this test.
BOOKKEEPING = {"postgres": ("bookkeepingSchema", "bk_{}"), "redis": ("bookkeepingPrefix", "bk{}")}


@pytest.mark.cost(1)
@pytest.mark.parametrize("store", STORES)
def test_bookkeeping_moved_before_the_batch_completes_is_refused(
    endpoints: Endpoints, unique: str, store: str, tmp_path: Path
) -> None:
    """The same sink id, its bookkeeping moved (``bookkeepingSchema``, ``bookkeepingPrefix``)
    after batch 1 was applied and before Spark recorded it: under the new name the sink
    finds no decision and would write the batch again. Refused until the batch completes
    under the old name."""
    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path, query)
    name, sink_id = f"moved_{unique}_{store}", f"moved-{unique}-{store}"
    option, pattern = BOOKKEEPING[store]
    old, new = pattern.format(unique), pattern.format(unique) + "_new"

    def writer(bookkeeping: str) -> TwoPhaseCommitWriter:
        options = {"sinkId": sink_id, "checkpointLocation": checkpoint, option: bookkeeping}
        source = _source(store, endpoints, name, **options)
        made = source.streamWriter(CONTRACT_SCHEMA, False)
        assert isinstance(made, TwoPhaseCommitWriter)
        return made

    first = writer(old)
    first.commit(_batch(first, query, 0, "run-1"), 0)  # type: ignore[arg-type]
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-commit@1"):
        first.commit(_batch(first, query, 1, "run-1"), 1)  # type: ignore[arg-type]
    with pytest.raises(SinkSwitchedMidBatchError, match=rf"option '{option}' changed from"):
        writer(new)
    replay = writer(old)
    replay.commit(_batch(replay, query, 1, "run-2"), 1)  # type: ignore[arg-type]
    _completed(checkpoint, 1)
    writer(new)
    assert _counts(store, endpoints, name) == {f"w{b}-{p}": 1 for b in (0, 1) for p in (0, 1)}


@pytest.mark.cost(2)
def test_a_kafka_transactional_id_prefix_moved_before_the_batch_completes_is_refused(
    endpoints: Endpoints, batch_commit_options: KafkaSinkOptions, tmp_path: Path
) -> None:
    """As above for the Kafka sink's ``transactionalIdPrefix``: its decisions and markers
    are keyed by it, so under a new prefix the replay would write the batch again."""
    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path, query)
    raw = {"checkpointLocation": checkpoint}
    old = batch_commit_options
    new = replace(old, transactional_id_prefix=f"{old.transactional_id_prefix}-new")
    start_checks(old, raw)  # the earlier start, as the checkpoint records it
    writer = BatchCommitWriter(old)
    rows = pa.RecordBatch.from_pydict({"key": [b"k0"], "value": [b"v0"]})
    prepared = [writer.write_task(a_task(1, partition=0, query=query), iter([rows]))]
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-commit@1"):
        writer.commit(list(prepared), 1)
    with pytest.raises(SinkSwitchedMidBatchError, match="option 'transactionalIdPrefix'"):
        start_checks(new, raw)
    _completed(checkpoint, 1)  # the replay under the old prefix completed it
    start_checks(new, raw)


@pytest.mark.cost(1)
@pytest.mark.hdfs
def test_the_batch_a_checkpoint_replays_is_read_on_local_disk_and_on_hdfs(
    hdfs_url: str, unique: str, tmp_path: Path
) -> None:
    """The checks run only when the checkpoint will replay a batch: its last planned one,
    not recorded complete. Read through WebHDFS's listing on HDFS (the checks would miss
    every switch there otherwise), and on a local disk."""
    from eos_connectors.core.checkpoint_sinks import planned_batches
    from eos_connectors.core.webhdfs import WebHdfs

    def incomplete_batch(location: str) -> int | None:
        planned = planned_batches(location)
        return None if planned is None else planned.incomplete

    remote = f"{hdfs_url}/switch-{unique}"
    hdfs = WebHdfs.for_uri(remote)
    path = remote.split("//", 1)[1].split("/", 1)[1]
    local = tmp_path / "local"
    assert incomplete_batch(remote) is None and incomplete_batch(str(local)) is None
    for log, batches in (("offsets", (0, 1, 2, 10)), ("commits", (0, 1, 2))):
        for batch in batches:
            hdfs.write_text(f"/{path}/{log}/{batch}", "v1\n{}\n")
            (local / log).mkdir(parents=True, exist_ok=True)
            (local / log / str(batch)).write_text("v1\n{}\n")
    assert incomplete_batch(remote) == 10 == incomplete_batch(str(local))
    hdfs.write_text(f"/{path}/commits/10", "v1\n{}\n")
    (local / "commits" / "10").write_text("v1\n{}\n")
    assert incomplete_batch(remote) is None and incomplete_batch(str(local)) is None


@pytest.mark.cost(1)
def test_a_redis_batch_is_applied_in_the_mode_it_was_decided_in(
    endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """Batch 1 adds 5 to each of two counters in ``mode=increment``; its driver dies after
    the decision, before applying it. The query restarts with ``mode=upsert`` (the same
    sink id): the replay applies the decided stages as increments, as they were staged
    (it applied them as values, leaving 5 where 10 belonged), and the next batch upserts."""
    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path, query)
    name = f"layout_{unique}"

    def writer(mode: str) -> TwoPhaseCommitWriter:
        options = {"sinkId": name, "checkpointLocation": checkpoint, "mode": mode}
        made = _source("redis", endpoints, name, **options).streamWriter(CONTRACT_SCHEMA, False)
        assert isinstance(made, TwoPhaseCommitWriter)
        return made

    def counters(made: TwoPhaseCommitWriter, batch: int, run: str) -> list[object]:
        return _batch(made, query, batch, run, n=5, word="w")

    first = writer("increment")
    first.commit(counters(first, 0, "run-1"), 0)  # type: ignore[arg-type]
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-decision@1"):
        first.commit(counters(first, 1, "run-1"), 1)  # type: ignore[arg-type]
    replay = writer("upsert")
    replay.commit(counters(replay, 1, "run-2"), 1)  # type: ignore[arg-type]
    assert _counts("redis", endpoints, name) == {"w-0": 10, "w-1": 10}, "applied as values"
    replay.commit(counters(replay, 2, "run-2"), 2)  # type: ignore[arg-type]
    assert _counts("redis", endpoints, name) == {"w-0": 5, "w-1": 5}


@pytest.mark.cost(1)
@pytest.mark.parametrize("store", STORES)
def test_an_at_least_once_start_first_settles_what_exactly_once_left(
    endpoints: Endpoints, unique: str, store: str, tmp_path: Path
) -> None:
    """Batch 1 (w = 7) is decided in exactly-once upsert mode; the driver dies before
    applying it. The query restarts with ``deliveryGuarantee=at-least-once``: its start
    applies the decided batch first, then its replay of batch 1 (w = 9, a replay need not
    repeat itself) writes over it, and a later exactly-once start leaves w at 9. Before,
    PostgreSQL's replay waited on the prepared transactions' row locks until its lock
    timeout, and Redis's later exactly-once start applied the old batch over the newer
    value (w back to 7)."""
    from tests.upsert_util import upsert_source, upserted

    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path, query)
    name = f"alo_{unique}_{store}"

    def writer(guarantee: str) -> DataSourceStreamWriter:
        options = {"checkpointLocation": checkpoint, "deliveryGuarantee": guarantee}
        source = upsert_source(store, endpoints, name, **options)
        return source.streamWriter(CONTRACT_SCHEMA, False)

    first = writer("exactly-once")
    assert isinstance(first, TwoPhaseCommitWriter)
    first.commit(_batch(first, query, 0, "run-1"), 0)  # type: ignore[arg-type]
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-decision@1"):
        first.commit(_batch(first, query, 1, "run-1", n=7, word="w"), 1)  # type: ignore[arg-type]
    assert "w-0" not in upserted(store, endpoints, name)

    replay = writer("at-least-once")
    assert upserted(store, endpoints, name)["w-0"] == 7, "the decided batch was not applied"
    rows = [pa.RecordBatch.from_pydict({"word": [f"w-{p}"], "n": [9]}, _ARROW) for p in (0, 1)]
    replay.commit([replay.write(iter([batch])) for batch in rows], 1)
    _completed(checkpoint, 1)
    again = writer("exactly-once")
    assert isinstance(again, TwoPhaseCommitWriter)
    again.commit(_batch(again, query, 2, "run-3", n=11, word="x"), 2)  # type: ignore[arg-type]
    assert upserted(store, endpoints, name) == {
        "w0-0": 1, "w0-1": 1, "w-0": 9, "w-1": 9, "x-0": 11, "x-1": 11
    }  # fmt: skip
