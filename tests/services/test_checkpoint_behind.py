"""A stream whose checkpoint is behind its sink's decisions is refused, in every
exactly-once sink, before it skips anything.

Found by probe (tests/spark/test_operator_actions.py runs it in Spark): a query wrote
batches 0-4 of 200 records, a copy of its checkpoint was taken, the query went on to
batch 9, and the copy was restored; the restarted query, reading 500 records a batch,
planned batches 5-9 again over 2,000 records, which every sink skipped as decided (the
first run's batches 5-9 held only 1,000 of them): the other 1,000 were lost, silently.
Deleting the last ``offsets/`` files by hand does the same. Now the start is refused
when the sink decided a batch past the checkpoint's last planned one, and, where the
start cannot read the checkpoint (``s3a:``, or one set by conf only), the commit of a
batch whose tasks found it decided while the sink decided a later one. A batch job's
rerun of an older version still writes nothing, unrefused. A checkpoint put back by
one batch, which neither can see, is refused at the commit by the source positions its
decision recorded; once refused, at a new driver's start, and
``eos checkpoint inspect`` flags it. Cost: ~14 s (ten cases).
"""

from __future__ import annotations

import json
import pickle
import shutil
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from eos_connectors.core.checkpoint_behind import CheckpointBehindSinkError
from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.protocol import TwoPhaseCommitWriter
from eos_connectors.core.sinks_admin import SinkAdmin
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.ops.checkpoint import read_checkpoint
from eos_connectors.ops.inspect import inspect
from eos_connectors.sinks.kafka import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.admin import KafkaSinkAdmin
from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter
from eos_connectors.sinks.kafka.checks import start_checks
from eos_connectors.sinks.kafka.clients import fenced_producer
from eos_connectors.sinks.kafka.format import planned_at
from eos_connectors.sinks.kafka.marker import MarkerGroup
from eos_connectors.sinks.kafka.options import KafkaSinkOptions, transactional_id
from eos_connectors.sinks.postgres import PostgresDataSource
from eos_connectors.sinks.postgres.admin import PostgresSinkAdmin
from eos_connectors.sinks.redis import RedisDataSource
from eos_connectors.sinks.redis.admin import RedisSinkAdmin
from eos_connectors.testing import CONTRACT_SCHEMA
from tests.kafka_sink_util import a_task, read_written
from tests.upsert_util import STORES, upserted

pytestmark = pytest.mark.services

_ARROW = pa.schema([pa.field("word", pa.string()), pa.field("n", pa.int64())])
#: Batches the sink decides before the checkpoint is taken back to ``KEPT``.
DECIDED, KEPT = 3, 1


def _checkpoint(folder: Path, query: str, batches: int) -> str:
    """A checkpoint as Spark leaves it after ``batches`` complete batches."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metadata").write_text(json.dumps({"id": query}))
    for log in ("offsets", "commits"):
        (folder / log).mkdir(exist_ok=True)
        for batch in range(batches):
            (folder / log / str(batch)).write_text(_planned(batch, 500 * (batch + 1)))
    return str(folder)


def _planned(batch: int, end: int) -> str:
    """An ``offsets/N`` file (a commit file is read only for its name): batch ``batch``
    planned up to position ``end``."""
    return f'v1\n{{"batchTimestampMs":{batch}}}\n{{"source":{{"0":{end}}}}}\n'


def _put_back_one_batch(checkpoint: str, batch: int) -> str:
    """The checkpoint's last batch deleted and planned again over more records (an old
    remedy for a query that will not start, with more input since); the deleted
    ``offsets/`` file's text."""
    offsets = Path(checkpoint) / "offsets" / str(batch)
    decided = offsets.read_text()
    (Path(checkpoint) / "commits" / str(batch)).unlink()
    offsets.write_text(_planned(batch, 500 * batch + 1500))
    return decided


def _taken_back(checkpoint: str, to: int) -> None:
    """The checkpoint as an older copy of it holds it: batches past ``to`` gone."""
    for log in ("offsets", "commits"):
        for path in (Path(checkpoint) / log).iterdir():
            if int(path.name) > to:
                path.unlink()


def _source(store: str, endpoints: Endpoints, name: str, **options: str) -> object:
    if store == "postgres":
        return PostgresDataSource(
            {"dsn": endpoints.postgres_dsn, "table": name, "createTable": "true"}
            | {"mode": "upsert", "keyColumns": "word", **options}
        )
    return RedisDataSource(
        {"url": endpoints.redis_url, "keyPrefix": f"{name}:", "keyColumn": "word"}
        | {"valueColumns": "n", **options}
    )


def _stream_writer(
    store: str, endpoints: Endpoints, name: str, **options: str
) -> TwoPhaseCommitWriter:
    """A stream's writer of sink ``name``, made as Spark makes it (its start checks run)."""
    source = _source(store, endpoints, name, sinkId=name, **options)
    made = source.streamWriter(CONTRACT_SCHEMA, False)  # type: ignore[attr-defined]
    assert isinstance(made, TwoPhaseCommitWriter)
    return made


def _batch(writer: TwoPhaseCommitWriter, query: str, batch: int, run: str) -> list[object]:
    """Batch ``batch``'s two tasks: ``w<batch>-<p>`` = 1."""
    units: list[object] = []
    for partition in range(2):
        task = TaskIdentity(query, None, run, batch, partition, batch * 10 + partition)
        rows = pa.RecordBatch.from_pydict({"word": [f"w{batch}-{partition}"], "n": [1]}, _ARROW)
        shipped: TwoPhaseCommitWriter = pickle.loads(pickle.dumps(writer))
        units.append(shipped.prepare_task(task, iter([rows])))
    return units


@pytest.mark.cost(1)
@pytest.mark.parametrize("store", STORES)
def test_a_checkpoint_behind_its_sink_is_refused_at_start_and_at_commit(
    endpoints: Endpoints, unique: str, store: str, tmp_path: Path
) -> None:
    """Batches 0-3 decided and applied; the checkpoint taken back to batch 1. Its start is
    refused, naming both batches; a start that cannot read the checkpoint goes on, and
    its batch 2 (other records than the sink's batch 2), which the tasks skip as decided,
    is refused at its commit. Nothing is written by either."""
    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path / "chk", query, DECIDED + 1)
    name = f"behind_{unique}_{store}"

    def writer(**options: str) -> TwoPhaseCommitWriter:
        return _stream_writer(store, endpoints, name, **options)

    first = writer(checkpointLocation=checkpoint)
    for batch in range(DECIDED + 1):
        first.commit(_batch(first, query, batch, "run-1"), batch)  # type: ignore[arg-type]
    written = upserted(store, endpoints, name)
    assert len(written) == 2 * (DECIDED + 1)

    shutil.copytree(checkpoint, tmp_path / "copy")
    _taken_back(checkpoint, KEPT)
    with pytest.raises(
        CheckpointBehindSinkError, match=rf"decided batch {DECIDED}, .* up to batch {KEPT}"
    ):
        writer(checkpointLocation=checkpoint)
    writer(checkpointLocation=str(tmp_path / "copy"))  # the checkpoint as it was: taken

    unread = writer()  # the checkpoint set by conf: the sink is not told where it is
    replanned = [
        pickle.loads(pickle.dumps(unread)).prepare_task(
            TaskIdentity(query, None, "run-2", KEPT + 1, p, 100 + p),
            iter([pa.RecordBatch.from_pydict({"word": [f"new-{p}"], "n": [1]}, _ARROW)]),
        )
        for p in range(2)
    ]
    assert all(m.skipped for m in replanned)
    with pytest.raises(
        CheckpointBehindSinkError, match=rf"batch {KEPT + 1} .* up to batch {DECIDED}"
    ):
        unread.commit(replanned, KEPT + 1)
    assert upserted(store, endpoints, name) == written


@pytest.mark.cost(1)
@pytest.mark.parametrize("store", STORES)
def test_a_checkpoint_put_back_by_one_batch_is_refused_at_the_commit(
    endpoints: Endpoints, unique: str, store: str, tmp_path: Path
) -> None:
    """Batches 0-3 decided and applied; the checkpoint's batch 3 deleted and planned again
    over more records, in a driver whose start checks ran before (the start of a new one
    would refuse: decided 3, planned 2). The tasks skip batch 3 as decided; its commit is
    refused, since the decision recorded other source positions. A new driver's start
    over the replanned ``offsets/3`` is refused before any task, and ``eos checkpoint
    inspect`` flags the sink. The batch replayed as decided (its ``offsets/3`` back)
    starts and commits quietly. Nothing is written by any."""
    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path / "chk", query, DECIDED + 1)
    name = f"behind1_{unique}_{store}"
    first = _stream_writer(store, endpoints, name, checkpointLocation=checkpoint)
    for batch in range(DECIDED + 1):
        first.commit(_batch(first, query, batch, "run-1"), batch)  # type: ignore[arg-type]
    written = upserted(store, endpoints, name)

    decided = _put_back_one_batch(checkpoint, DECIDED)
    replanned = _batch(first, query, DECIDED, "run-2")
    assert all(getattr(m, "skipped", False) for m in replanned)
    with pytest.raises(CheckpointBehindSinkError, match=rf"batch {DECIDED} .* other source"):
        first.commit(replanned, DECIDED)  # type: ignore[arg-type]
    with pytest.raises(CheckpointBehindSinkError, match=rf"batch {DECIDED} .* other source"):
        _stream_writer(store, endpoints, name, checkpointLocation=checkpoint)
    assert _inspected(_admin(store, endpoints), checkpoint, name) == (DECIDED, True)

    (Path(checkpoint) / "offsets" / str(DECIDED)).write_text(decided)
    assert _inspected(_admin(store, endpoints), checkpoint, name) == (DECIDED, False)
    again = _stream_writer(store, endpoints, name, checkpointLocation=checkpoint)
    again.commit(_batch(again, query, DECIDED, "run-3"), DECIDED)  # type: ignore[arg-type]
    assert upserted(store, endpoints, name) == written


def _admin(store: str, endpoints: Endpoints) -> SinkAdmin:
    if store == "postgres":
        return PostgresSinkAdmin(endpoints.postgres_dsn)
    return RedisSinkAdmin(endpoints.redis_url)


def _inspected(admin: SinkAdmin, checkpoint: str, sink_id: str) -> tuple[int, bool]:
    """What ``eos checkpoint inspect`` shows of the sink: its last decided batch, and
    whether it decided it over other source positions than the checkpoint plans now."""
    try:
        record = admin.record(sink_id)
    finally:
        admin.close()
    (shown,) = inspect(read_checkpoint(checkpoint), [record])["sinks"]
    return shown["last_decided_batch"], shown["replanned"]


@pytest.mark.cost(1)
def test_a_decisions_table_made_before_its_offsets_column_gets_it_or_goes_without(
    endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """A PostgreSQL ``decisions`` table an earlier release made has no ``offsets`` column.
    Until someone adds it (its owner may not be the sink's user), decisions are written
    and read as before, without source positions, so the one-batch check passes by; the
    next start of a user that owns the table adds it, and the check holds again."""
    import psycopg

    query, name, schema = str(uuid.uuid4()), f"nocol_{unique}", f"bk_{unique}"
    checkpoint = _checkpoint(tmp_path / "chk", query, 2)
    options = {"checkpointLocation": checkpoint, "bookkeepingSchema": schema}
    writer = _stream_writer("postgres", endpoints, name, **options)
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f"ALTER TABLE {schema}.decisions DROP COLUMN offsets")
    writer.commit(_batch(writer, query, 0, "run-1"), 0)  # type: ignore[arg-type]
    assert _decided_over(writer, name, 0) == ""

    writer = _stream_writer("postgres", endpoints, name, **options)  # the start adds it
    writer.commit(_batch(writer, query, 1, "run-1"), 1)  # type: ignore[arg-type]
    assert _decided_over(writer, name, 1) != ""
    _put_back_one_batch(checkpoint, 1)
    with pytest.raises(CheckpointBehindSinkError, match=r"batch 1 .* other source"):
        writer.commit(_batch(writer, query, 1, "run-2"), 1)  # type: ignore[arg-type]


def _decided_over(writer: TwoPhaseCommitWriter, sink_id: str, batch: int) -> str:
    decision = writer.find_decision(sink_id, batch)
    assert decision is not None
    return decision.offsets


def _kafka_rows(batch: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"key": [b"k"], "value": [f"b{batch}".encode()]})


@pytest.mark.cost(2)
@pytest.mark.parametrize("mode", ["batch", "task"])
def test_a_kafka_checkpoint_behind_its_sink_is_refused(
    endpoints: Endpoints, batch_commit_options: KafkaSinkOptions, mode: str, tmp_path: Path
) -> None:
    """The same with the Kafka sink: ``commitMode=batch`` refuses at the start (its
    decision pointer) and at the commit; ``commitMode=task``, whose markers are per task
    partition, at the commit (a task partition marked past the next batch)."""
    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path, query, DECIDED + 1)
    raw = {"checkpointLocation": checkpoint}
    options = replace(batch_commit_options, commit_mode=mode)
    assert options.topic is not None
    made = BatchCommitWriter(options) if mode == "batch" else KafkaExactlyOnceWriter(options)

    def run(batch: int, attempt: str) -> list[object]:
        return [
            made.write_task(
                a_task(batch, run=attempt, partition=p, query=query), iter([_kafka_rows(batch)])
            )
            for p in range(2)
        ]

    start_checks(options, raw)
    for batch in range(DECIDED + 1):
        made.commit(run(batch, "run-1"), batch)  # type: ignore[arg-type]
    written = sorted(r.value for r in read_written(options.kafka, options.topic))
    assert len(written) == 2 * (DECIDED + 1)

    _taken_back(checkpoint, KEPT)
    if mode == "batch":
        with pytest.raises(
            CheckpointBehindSinkError, match=rf"decided batch {DECIDED}, .* up to batch {KEPT}"
        ):
            start_checks(options, raw)
    replanned = run(KEPT + 1, "run-2")
    assert all(
        getattr(m, "skipped", None) or getattr(m, "state", "") in ("marked", "decided")
        for m in replanned
    )
    with pytest.raises(
        CheckpointBehindSinkError, match=rf"batch {KEPT + 1} .* up to batch {DECIDED}"
    ):
        made.commit(replanned, KEPT + 1)  # type: ignore[arg-type]
    assert sorted(r.value for r in read_written(options.kafka, options.topic)) == written


@pytest.mark.cost(2)
@pytest.mark.parametrize("mode", ["batch", "task"])
def test_a_kafka_checkpoint_put_back_by_one_batch_is_refused_at_the_commit(
    endpoints: Endpoints, batch_commit_options: KafkaSinkOptions, mode: str, tmp_path: Path
) -> None:
    """The same with the Kafka sink, a writer a batch as Spark makes them.
    ``commitMode=batch``: its decision record keeps the source positions.
    ``commitMode=task``, which decides nothing on the driver: each task partition's
    marker keeps the digest of the ``offsets/N`` its writer was made over (the driver
    reads it as Spark makes the writer for batch N). The replanned batch's tasks skip it,
    its commit is refused, so is a new driver's start (which replays it), and ``eos
    checkpoint inspect`` flags the sink; with the file back, all goes quietly."""
    query = str(uuid.uuid4())
    folder = tmp_path / "chk"
    checkpoint = _checkpoint(folder, query, 0)
    options = replace(batch_commit_options, commit_mode=mode)
    assert options.topic is not None

    def commit(batch: int, attempt: str) -> None:
        made: BatchCommitWriter | KafkaExactlyOnceWriter = (
            BatchCommitWriter(options, checkpoint)
            if mode == "batch"
            else KafkaExactlyOnceWriter(options, checkpoint, planned_at(checkpoint))
        )
        shipped = pickle.loads(pickle.dumps(made))
        tasks = [a_task(batch, run=attempt, partition=p, query=query) for p in range(2)]
        messages = [shipped.write_task(t, iter([_kafka_rows(batch)])) for t in tasks]
        if attempt != "run-1":
            assert all(
                getattr(m, "skipped", None) or getattr(m, "state", "") in ("marked", "decided")
                for m in messages
            )
        made.commit(messages, batch)

    start_checks(options, {"checkpointLocation": checkpoint})
    for batch in range(DECIDED + 1):
        _checkpoint(folder, query, batch + 1)
        commit(batch, "run-1")
    written = sorted(r.value for r in read_written(options.kafka, options.topic))
    assert len(written) == 2 * (DECIDED + 1)

    decided = _put_back_one_batch(checkpoint, DECIDED)
    with pytest.raises(CheckpointBehindSinkError, match=rf"batch {DECIDED} .* other source"):
        commit(DECIDED, "run-2")
    with pytest.raises(CheckpointBehindSinkError, match=rf"batch {DECIDED} .* other source"):
        start_checks(options, {"checkpointLocation": checkpoint})
    sink_id = options.sink_id_for(query)

    def admin() -> SinkAdmin:
        prefix, marker_log = options.transactional_id_prefix, options.marker_log
        return KafkaSinkAdmin(options.client_config(), prefix, marker_log)

    assert _inspected(admin(), checkpoint, sink_id) == (DECIDED, True)
    (Path(checkpoint) / "offsets" / str(DECIDED)).write_text(decided)
    assert _inspected(admin(), checkpoint, sink_id) == (DECIDED, False)
    start_checks(options, {"checkpointLocation": checkpoint})
    commit(DECIDED, "run-3")
    assert sorted(r.value for r in read_written(options.kafka, options.topic)) == written


@pytest.mark.cost(2)
def test_a_task_mode_replay_start_never_waits_for_an_attempt_left_open_on_the_marker_log(
    endpoints: Endpoints, batch_commit_options: KafkaSinkOptions, tmp_path: Path
) -> None:
    """A ``commitMode=task`` start that replays a batch reads that batch's markers (their
    source positions) from the marker log as far as it is stable, without waiting for
    the transactions open on it: an attempt of the run that died leaves its transaction
    (its marker record in it) open until its task's retry fences it, which runs only
    after the start. A read that waited for them held the start up to the transaction
    timeout. The replay then writes the batch once."""
    query = str(uuid.uuid4())
    folder = tmp_path / "chk"
    options = replace(batch_commit_options, commit_mode="task")
    assert options.topic is not None

    def write(batch: int) -> list[object]:
        checkpoint = str(folder)
        made = KafkaExactlyOnceWriter(options, checkpoint, planned_at(checkpoint))
        messages: list[object] = [
            made.write_task(
                a_task(batch, run="run-1", partition=p, query=query), iter([_kafka_rows(batch)])
            )
            for p in range(2)
        ]
        made.commit(messages, batch)  # type: ignore[arg-type]
        return messages

    for batch in range(DECIDED):
        _checkpoint(folder, query, batch + 1)
        write(batch)
    (folder / "offsets" / str(DECIDED)).write_text(_planned(DECIDED, 500 * (DECIDED + 1)))
    name = transactional_id(options, options.sink_id_for(query), 0)
    dead = fenced_producer(options, name)  # the dead run's attempt of task partition 0
    dead.begin_transaction()
    topic, key, value = MarkerGroup(options, name).log_record(DECIDED + 1, query, "other")
    dead.produce(topic, value, key, partition=0)
    dead.flush(30)

    began = time.monotonic()
    start_checks(options, {"checkpointLocation": str(folder)})
    assert time.monotonic() - began < 10, "the start waited for the open transaction"
    write(DECIDED)  # the retry fences the dead attempt, and writes the batch
    written = [r.value for r in read_written(options.kafka, options.topic)]
    assert sorted(written) == sorted(f"b{b}".encode() for b in range(DECIDED + 1) for _ in "01")
