"""The Kafka sink's batch commit (``commitMode=batch``) on the real broker, driven without
Spark: tasks leave their transactions open, the driver decides and commits. Nothing of a
batch is visible before the driver's commit, all of it after; a driver that died after
the decision finishes on the replay, and an attempt that starts after the decision
(a zombie, a replayed task) never touches the decided transaction; a decided
transaction aborted before its commit is written again by the replay; a batch that
failed before its decision is written again in full whatever its new rows; ``abort``
ends an undecided batch and never a decided one, and a task that writes after it leaves
no hanging transaction; a stream's start aborts what its last decision does not name;
``eos sinks`` lists and resets it; a batch job's version decided by a driver that died
is committed before the next version.

Cost: ~36 s in CI (seventeen tests; the woken driver that read the pointer before it
paused, ~3 s); an eighteenth, the coordinator's own timeout (~22 s), is `make soak`'s."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import pyarrow as pa
import pytest

from eos_connectors.core import faults
from eos_connectors.core.batch_job import BatchJob, JobPlan
from eos_connectors.core.checkpoint_behind import CheckpointBehindSinkError
from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter, PreparedTask
from eos_connectors.sinks.kafka.coordinator import TransactionClient
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.options import KafkaSinkOptions, ids_prefix
from eos_connectors.sinks.kafka.options import parse_options as sink_options
from tests.kafka_sink_util import (
    a_task,
    new_sink_options,
    opened_with,
    wait_for_markers,
    wait_until_ended,
)

pytestmark = pytest.mark.services

TASKS = 2


@pytest.fixture
def writer(batch_commit_options: KafkaSinkOptions) -> BatchCommitWriter:
    return BatchCommitWriter(batch_commit_options)


def _rows(batch: int, partition: int, tag: str = "") -> list[pa.RecordBatch]:
    values = [f"b{batch}-p{partition}-r{i}{tag}".encode() for i in range(40)]
    keys = [f"k{i % 7}".encode() for i in range(40)]
    return [pa.RecordBatch.from_arrays([pa.array(keys), pa.array(values)], ["key", "value"])]


def _prepare(
    writer: BatchCommitWriter, batch: int, run: str = "run-1", tag: str = "", tasks: int = TASKS
) -> list[PreparedTask]:
    return [
        writer.write_task(a_task(batch, run=run, partition=p), iter(_rows(batch, p, tag)))
        for p in range(tasks)
    ]


def _visible(endpoints: Endpoints, writer: BatchCommitWriter) -> list[bytes]:
    topic, sink_id = writer.options.topic, writer.options.sink_id
    assert topic is not None and sink_id is not None
    wait_for_markers(endpoints.kafka, ids_prefix(writer.options, sink_id))
    records = read_to_end(endpoints.kafka, topic, timeout=10)
    return sorted(r.value or b"" for r in records)


def _expected(batches: range, tag: str = "", tasks: int = TASKS) -> list[bytes]:
    return sorted(
        v
        for b in batches
        for p in range(tasks)
        for v in _rows(b, p, tag)[0].column("value").to_pylist()
    )


def test_a_batch_is_visible_only_once_committed_across_driver_crashes_and_zombies(
    endpoints: Endpoints, writer: BatchCommitWriter
) -> None:
    """Batch 0: nothing visible after the tasks prepared, nor after a driver that died
    past the decision (Spark's abort then touches nothing decided); the replay's tasks
    (zombies of the batch as far as the ids go) find it decided and write nothing, and
    the replay's commit finishes it. Batch 1: prepare, commit. Batch 2: a decided
    transaction aborted before its commit (the coordinator's timeout, or an attempt
    that initialised the id in the window before the decision): the driver names it and
    fails; the replay writes that task partition again, and nothing else. The fixture's
    leftover check finds no open transaction at the end."""
    from confluent_kafka import Producer

    prepared = _prepare(writer, 0)
    assert {m.state for m in prepared} == {"prepared"}
    assert _visible(endpoints, writer) == [], "visible before the decision"
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-decision@0"):
        writer.commit(list(prepared), 0)
    assert _visible(endpoints, writer) == [], "a decided batch is visible only once committed"
    writer.abort(list(prepared), 0)  # Spark may abort after the failure: never a decided one
    replay = _prepare(writer, 0, run="run-2", tag="-other-rows")
    assert {m.state for m in replay} == {"decided"}, "a task touched a decided batch"
    writer.commit(list(replay), 0)
    assert _visible(endpoints, writer) == _expected(range(1)), "the decided rows, once"

    writer.commit(list(_prepare(writer, 1)), 1)
    assert _visible(endpoints, writer) == _expected(range(2))

    prepared = _prepare(writer, 2)
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-decision@2"):
        writer.commit(list(prepared), 2)
    lost = prepared[1].txn
    assert lost is not None
    Producer({**endpoints.kafka, "transactional.id": lost.transactional_id}).init_transactions(30)
    replay = _prepare(writer, 2, run="run-2")
    with pytest.raises(KafkaSinkError, match=r"task partitions \[1\] of the batch are not"):
        writer.commit(list(replay), 2)
    partial = [v for v in _expected(range(3)) if b"b2-p1-" not in v]
    assert _visible(endpoints, writer) == partial, "the other partitions are committed"
    again = _prepare(writer, 2, run="run-3")
    assert [m.state for m in again] == ["marked", "prepared"]
    writer.commit(list(again), 2)
    assert _visible(endpoints, writer) == _expected(range(3)), "each record once"


@pytest.mark.cost(3)
def test_a_jobs_version_decided_by_a_dead_driver_is_committed_before_the_next_one_runs(
    endpoints: Endpoints, writer: BatchCommitWriter
) -> None:
    """``df.write`` in batch mode (the job's ``txnVersion`` is the batch): version 5's
    driver dies after its decision; version 6's plan commits version 5's transactions
    before any task of 6 runs (a task of 6 initialising its id would abort them); a rerun
    of 6 finds it decided and writes nothing, and version 4 is skipped."""
    sink = writer.options.sink_id
    assert sink is not None

    def run(job: BatchJob, tag: str = "") -> list[PreparedTask]:
        return [
            writer.write_as(
                a_task(job.version, run=job.run_id, partition=p, query=job.query_id),
                iter(_rows(job.version, p, tag)),
            )
            for p in range(TASKS)
        ]

    five = BatchJob(sink, 5, "run-a")
    assert writer.plan_job(five) == JobPlan()
    prepared = run(five)
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-decision@5"):
        writer.commit(list(prepared), 5)
    assert _visible(endpoints, writer) == []
    assert writer.plan_job(BatchJob(sink, 6, "run-b")) == JobPlan()
    assert _visible(endpoints, writer) == _expected(range(5, 6)), "version 5 not committed"
    writer.commit(list(run(BatchJob(sink, 6, "run-b"))), 6)
    assert _visible(endpoints, writer) == _expected(range(5, 7))

    rerun = BatchJob(sink, 6, "run-c")
    assert writer.plan_job(rerun) == JobPlan()
    again = run(rerun, tag="-again")
    # its own transactional ids (sinks/kafka/runs.py): the pointer, not a marker, says so
    assert {m.state for m in again} == {"decided"}, "a task wrote a committed version again"
    writer.commit(list(again), 6)
    assert writer.plan_job(BatchJob(sink, 4, "run-d")).skip == "txnVersion 6 was committed before"
    assert _visible(endpoints, writer) == _expected(range(5, 7)), "each record once"


@pytest.mark.cost(3)
def test_a_decision_is_read_behind_another_clients_transaction_on_the_marker_log(
    endpoints: Endpoints, writer: BatchCommitWriter
) -> None:
    """Another client's transaction on the shared marker log (a task-mode sink's marker)
    opens before batch 0's decision, and ends 2 s after its driver died past the decision.
    The replay's tasks read the decision, which sits behind the log's last stable offset
    meanwhile: they wait for that transaction instead of taking the decided batch for one
    with no decision (they failed: "holds no decision of it"), and the commit finishes
    the batch once."""
    from confluent_kafka import Producer

    other = Producer({**endpoints.kafka, "transactional.id": f"other-{writer.options.sink_id}"})
    other.init_transactions(30)
    other.begin_transaction()
    other.produce(writer.options.marker_log, b"a marker", b"another sink's task", partition=0)
    other.flush(30)
    prepared = _prepare(writer, 0)
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-decision@0"):
        writer.commit(list(prepared), 0)
    ends = threading.Timer(2.0, lambda: other.abort_transaction(30))
    ends.start()
    began = time.monotonic()
    try:
        replay = _prepare(writer, 0, run="run-2")
    finally:
        ends.join()
    assert time.monotonic() - began > 1.5, "the decision was read before the log settled"
    assert {m.state for m in replay} == {"decided"}
    writer.commit(list(replay), 0)
    assert _visible(endpoints, writer) == _expected(range(1)), "the decided rows, once"


def test_an_undecided_batch_is_aborted_or_rewritten_in_full_by_its_replay(
    endpoints: Endpoints, writer: BatchCommitWriter
) -> None:
    """Spark's abort of an undecided batch ends every task's open transaction (one report
    reached it). A batch whose driver never heard of its tasks is replayed with other
    rows (a rand() column) in fewer tasks (another split): only the replay's rows are
    visible, and the open transaction of the task partition it no longer has is aborted
    by the commit's sweep, not left to the transaction timeout. A batch too old for its
    transaction timeout is refused before its decision and written by the replay."""
    from eos_connectors.sinks.kafka.decisions import read_pointer

    sink_id = writer.options.sink_id
    assert sink_id is not None
    client = TransactionClient(writer.options.kafka)
    try:
        prepared = _prepare(writer, 0)
        assert len(client.open_transactions(ids_prefix(writer.options, sink_id))) == TASKS
        writer.abort(list(prepared[:1]), 0)
        assert client.open_transactions(ids_prefix(writer.options, sink_id)) == []
        assert _visible(endpoints, writer) == []

        _prepare(writer, 0, run="run-2")  # the driver never heard of them: nothing decided
        replay = _prepare(writer, 0, run="run-3", tag="-replayed", tasks=TASKS - 1)
        assert {m.state for m in replay} == {"prepared"}
        writer.commit(list(replay), 0)
        first = _expected(range(1), "-replayed", TASKS - 1)
        assert _visible(endpoints, writer) == first
        assert client.open_transactions(ids_prefix(writer.options, sink_id)) == []

        # A batch whose oldest transaction is too close to its timeout for the driver to
        # commit first (aged here by its report) is refused before any decision: its
        # transactions aborted, nothing visible, the pointer still at batch 0.
        slow = _prepare(writer, 1)
        slow[0].opened_at -= writer.options.transaction_timeout_ms / 1000
        with pytest.raises(KafkaSinkError, match=r"maxOffsetsPerTrigger.*commitMode=task"):
            writer.commit(list(slow), 1)
        pointer = read_pointer(writer.options, sink_id)
        assert pointer is not None and pointer[0] == 1, "batch 1 was decided"
        assert client.open_transactions(ids_prefix(writer.options, sink_id)) == []
        assert _visible(endpoints, writer) == first
        writer.commit(list(_prepare(writer, 1, run="run-4")), 1)
        assert _visible(endpoints, writer) == sorted(first + _expected(range(1, 2)))
    finally:
        client.close()


@pytest.mark.cost(1)
@pytest.mark.parametrize("aborted_by", ["another client", "the driver"])
def test_a_task_that_writes_after_its_transaction_ended_leaves_nothing_open(
    endpoints: Endpoints, writer: BatchCommitWriter, aborted_by: str
) -> None:
    """A task attempt paused between its rows (its executor frozen) while its transaction
    is ended, then woken: its later records are refused and the task fails. Nothing is
    visible and nothing is left open.

    ``another client``: an ``EndTxn(abort)`` at its epoch. The broker refuses a record to
    a partition of the ended transaction, since it checks that a transactional write
    belongs to an open transaction (KIP-890; the start check warns of a broker that does
    not): without that check the record would start a transaction no coordinator knows
    of, holding every read_committed reader of the partition back until an operator
    aborts it. ``the driver``: the batch failed and Spark's abort ends the sink's open
    transactions by fencing their ids; the woken producer's record to a partition it had
    not written is refused as fenced. Ended by ``EndTxn(abort)``, that record began a new
    transaction at its epoch (without the marker's offset, so never committed: rule 30)
    and the task reported it, left open until a later batch's sweep; a batch job has
    none."""
    from eos_connectors.dev.harness.checks import open_transactions

    sink_id, topic = writer.options.sink_id, writer.options.topic
    assert sink_id is not None and topic is not None
    client = TransactionClient(writer.options.kafka)

    def paused_between_its_rows() -> Iterator[pa.RecordBatch]:
        yield _placed(_rows(0, 0)[0], 0)
        txn = opened_with(client, writer.options, 40)
        if aborted_by == "the driver":
            writer.abort([], 0)  # the batch failed: the driver ends what its tasks left open
        else:
            client.end([txn], commit=False)
        wait_until_ended(client, txn.transactional_id)  # markers written
        # to a partition it wrote (another client), to one it had not (the driver)
        yield _placed(_rows(0, 0, "-late")[0], 0 if aborted_by == "another client" else 1)

    refused = r"Kafka refused \d+ records" if aborted_by == "another client" else r"fenced"
    try:
        with pytest.raises(KafkaSinkError, match=refused):
            writer.write_task(a_task(0), paused_between_its_rows())
        assert client.open_transactions(ids_prefix(writer.options, sink_id)) == []
        assert open_transactions(endpoints.kafka_bootstrap, topic, timeout=10) == set()
        assert _visible(endpoints, writer) == []
    finally:
        client.close()


def _placed(rows: pa.RecordBatch, partition: int) -> pa.RecordBatch:
    """``rows``'s values, all to topic partition ``partition``."""
    at = pa.array([partition] * rows.num_rows, pa.int32())
    return pa.RecordBatch.from_arrays([rows.column("value"), at], ["value", "partition"])


def test_a_transaction_aborted_while_its_task_wrote_is_never_committed_in_part(
    endpoints: Endpoints, writer: BatchCommitWriter
) -> None:
    """Another client aborts a task's transaction at its epoch while the task writes (a
    stale driver's sweep, an operator's tool), and the task writes on, to a partition it
    had not written yet. Under transaction protocol version 1 the producer's next
    AddPartitionsToTxn begins a new transaction at the same epoch: the task reports the
    same producer id and epoch, now naming a transaction that holds only what came after
    the abort. Its commit would make that part visible and lose the rest for good (before
    the marker's offset came first, the new transaction held the marker too, and the
    batch was silently short). The driver finds it begun again (ongoing without the
    marker's offsets partition), aborts it and fails naming the task partition; the
    replay writes it again, each record once. Cost: ~2 s."""
    from eos_connectors.sinks.kafka.decisions import Decision, write_decision

    sink_id = writer.options.sink_id
    assert sink_id is not None
    client = TransactionClient(writer.options.kafka)

    def aborted_while_writing() -> Iterator[pa.RecordBatch]:
        yield _placed(_rows(0, 0)[0], 0)
        txn = opened_with(client, writer.options, 40)
        client.end([txn], commit=False)  # a stale sweep's abort, at the task's own epoch
        wait_until_ended(client, txn.transactional_id)
        yield _placed(_rows(0, 0, "-after")[0], 1)

    try:
        prepared = [writer.write_task(a_task(0, partition=0), aborted_while_writing())]
        prepared += [writer.write_task(a_task(0, partition=1), iter(_rows(0, 1)))]
        txns = {r.partition: r.txn for r in prepared if r.txn is not None}
        write_decision(writer.options, sink_id, Decision(0, prepared[0].query_id, txns, 80))
        with pytest.raises(KafkaSinkError, match=r"begun again\).*task partitions \[0\]"):
            writer.commit(list(prepared), 0)
        others = [v for v in _expected(range(1)) if v.startswith(b"b0-p1-")]
        assert _visible(endpoints, writer) == others, "nothing of task partition 0"
        assert client.open_transactions(ids_prefix(writer.options, sink_id)) == []
        replay = _prepare(writer, 0, run="run-2")
        assert [m.state for m in replay] == ["prepared", "marked"], "only partition 0 again"
        writer.commit(list(replay), 0)
        assert _visible(endpoints, writer) == _expected(range(1)), "each record once"
    finally:
        client.close()


def test_a_decided_transaction_another_client_aborted_is_written_again_not_stalled(
    endpoints: Endpoints, writer: BatchCommitWriter
) -> None:
    """Batch 0 is decided, then one of its transactions is aborted at its own epoch before
    the driver commits it: ``EndTxn(abort)``, as the sweep of a driver that was paused
    since an earlier batch sends for every open transaction it lists. The commit is
    refused (``INVALID_TXN_STATE``, not "fenced": an abort moves no epoch) and judged by
    the marker: the commit fails naming the task partition and nothing of it is visible.
    Before, every replay's commit was refused the same way and the query stalled for
    good. The replay writes that task partition again; each record is visible once."""
    from eos_connectors.sinks.kafka.coordinator import kept_client
    from eos_connectors.sinks.kafka.decisions import Decision, write_decision

    options, sid = writer.options, writer.options.sink_id
    assert sid is not None
    prepared = _prepare(writer, 0)
    txns = {r.partition: r.txn for r in prepared if r.txn is not None}
    write_decision(options, sid, Decision(0, prepared[0].query_id, txns, 80))
    with kept_client(options.kafka) as client:
        client.end([txns[1]], commit=False)  # a stale sweep's abort
    with pytest.raises(KafkaSinkError, match=r"INVALID_TXN_STATE.*task partitions \[1\]"):
        writer.commit(list(prepared), 0)
    replay = _prepare(writer, 0, run="run-2")
    assert [m.state for m in replay] == ["marked", "prepared"], "only partition 1 again"
    writer.commit(list(replay), 0)
    assert _visible(endpoints, writer) == _expected(range(1)), "each record once"


def test_a_decided_transaction_whose_id_the_coordinator_forgot_is_written_again(
    endpoints: Endpoints, writer: BatchCommitWriter
) -> None:
    """A driver that died after batch 0's decision comes back after the transactional
    ids expired at their coordinator (``transactional.id.expiration.ms``, 7 days by
    default; its transaction was aborted by its timeout long before): the commit is
    answered ``INVALID_PRODUCER_ID_MAPPING``, raised as is on every restart before, so
    the query could never go on. It is judged by the marker as an abort is: the task
    partition is named, and the replay writes it again. (A decision naming an id the
    coordinator never knew is answered the same way as one it forgot.)"""
    from eos_connectors.sinks.kafka.coordinator import kept_client
    from eos_connectors.sinks.kafka.decisions import Decision, write_decision

    options, sid = writer.options, writer.options.sink_id
    assert sid is not None
    prepared = _prepare(writer, 0)
    txns = {r.partition: r.txn for r in prepared if r.txn is not None}
    with kept_client(options.kafka) as client:
        client.end([txns[1]], commit=False)  # the timeout's abort, days ago
    forgotten = dataclasses.replace(txns[1], transactional_id=f"{ids_prefix(options, sid)}1a15")
    write_decision(options, sid, Decision(0, prepared[0].query_id, {**txns, 1: forgotten}, 80))
    with pytest.raises(KafkaSinkError, match=r"task partitions \[1\] of the batch.*forgotten its"):
        writer.commit(list(prepared), 0)
    replay = _prepare(writer, 0, run="run-2")
    assert [m.state for m in replay] == ["marked", "prepared"], "only partition 1 again"
    writer.commit(list(replay), 0)
    assert _visible(endpoints, writer) == _expected(range(1)), "each record once"


def test_two_live_attempts_of_one_task_partition_never_fence_each_other(
    endpoints: Endpoints, writer: BatchCommitWriter
) -> None:
    """A stage resubmitted after an executor was lost runs task partition 1 again while its
    first attempt still runs (tests/system/test_distributed.py saw it): the second attempt
    prepares after the first one reported, and Spark keeps the first one's report. With
    one transactional id per task partition the second attempt's InitProducerId aborted
    the kept transaction, and the batch failed after its decision. Each attempt has its
    own id now (its attempt slot): the kept transaction commits, the other attempt's is a
    stray the commit's sweep ends, and nothing else is visible or left open."""

    sink_id = writer.options.sink_id
    assert sink_id is not None
    kept = _prepare(writer, 0)
    loser = writer.write_task(a_task(0, partition=1), iter(_rows(0, 1, "-second-attempt")))
    assert loser.state == "prepared" and loser.txn is not None and kept[1].txn is not None
    writer.commit(list(kept), 0)
    assert _visible(endpoints, writer) == _expected(range(1)), "the kept attempt's rows, once"
    client = TransactionClient(writer.options.kafka)
    try:
        assert client.open_transactions(ids_prefix(writer.options, sink_id)) == []
    finally:
        client.close()


@pytest.mark.cost(2)
def test_a_streams_start_aborts_what_its_last_decision_does_not_name(
    endpoints: Endpoints, writer: BatchCommitWriter
) -> None:
    """Batch 1 is decided and its driver dies before its commits, while an attempt of
    batch 1 that Spark did not keep (another attempt slot) is still open: no later
    commit of that run sweeps it. The next run's start aborts it and keeps the decided
    transactions, which the replay's commit ends: each record once, nothing left open.
    A start for another query's pointer (a sink id not yet reset) aborts nothing."""
    from eos_connectors.sinks.kafka.stream_decider import sweep_at_start

    sid = writer.options.sink_id
    assert sid is not None
    writer.commit(list(_prepare(writer, 0)), 0)
    prepared = _prepare(writer, 1)
    lost = writer.write_task(a_task(1, partition=0), iter(_rows(1, 0, "-not-kept")))
    assert lost.txn is not None
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-decision@1"):
        writer.commit(list(prepared), 1)
    assert sweep_at_start(writer.options, sid, "another-query") == []
    aborted = sweep_at_start(writer.options, sid, "kafka-query")
    assert [t.transactional_id for t in aborted or []] == [lost.txn.transactional_id]
    client = TransactionClient(writer.options.kafka)
    try:
        left = set(client.open_transactions(ids_prefix(writer.options, sid)))
        assert left == {r.txn for r in prepared}, "a decided transaction was aborted"
    finally:
        client.close()
    replay = _prepare(writer, 1, run="run-2")
    assert {m.state for m in replay} == {"decided"}
    writer.commit(list(replay), 1)
    assert _visible(endpoints, writer) == _expected(range(2)), "each record once"


def _stale_driver(
    writer: BatchCommitWriter, reports: list[PreparedTask]
) -> tuple[threading.Thread, list[BaseException]]:
    """Run 1's driver committing batch 0 in a thread named ``run-1-driver`` (for a test
    to pause it), and the list its failure goes to."""
    failed: list[BaseException] = []

    def run_1() -> None:
        try:
            writer.commit(list(reports), 0)
        except BaseException as exc:  # the caller's assertion names it
            failed.append(exc)

    stale = threading.Thread(target=run_1, name="run-1-driver")
    stale.start()
    return stale, failed


def test_a_driver_woken_after_the_next_run_took_over_spares_its_transactions(
    endpoints: Endpoints, writer: BatchCommitWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run 1's driver decides batch 0 and stops between its commits (paused: a frozen
    driver that the cluster manager replaced). Run 2 finishes batch 0 (decided: its
    tasks write nothing, its commit ends the transactions again) and its tasks open batch
    1's transactions. Run 1's driver wakes and finishes its commit, sweep included. The
    sweep ends only transactions begun before its commit was called, so run 2's stay
    open and run 2 commits batch 1: each record once. Before, that sweep aborted them and
    run 2's commit of batch 1 failed."""
    from eos_connectors.core import faults

    paused, resume = threading.Event(), threading.Event()
    point = faults.point

    def pausing(name: str, *args: object, **kwargs: object) -> None:
        if name == "between-commits" and threading.current_thread().name == "run-1-driver":
            paused.set()
            assert resume.wait(60)
        point(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(faults, "point", pausing)
    stale, failed = _stale_driver(writer, _prepare(writer, 0))
    assert paused.wait(30), "run 1's driver never reached its commits"
    run_2 = BatchCommitWriter(writer.options)
    replay = _prepare(run_2, 0, run="run-2")
    # Task partition 0's transaction was committed before the pause, but the broker applies
    # its marker's offset a moment after it answered: "decided" until then (a loaded CI).
    assert replay[0].state in ("marked", "decided") and replay[1].state == "decided"
    run_2.commit(list(replay), 0)
    second = _prepare(run_2, 1, run="run-2")
    resume.set()
    stale.join(60)
    assert not stale.is_alive() and not failed, failed
    run_2.commit(list(second), 1)
    assert _visible(endpoints, writer) == _expected(range(2)), "each record once"


def test_a_driver_woken_after_the_next_run_decided_never_moves_the_pointer_back(
    endpoints: Endpoints, writer: BatchCommitWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run 1's driver reads the pointer for batch 0 and pauses before its decision (a
    frozen driver the cluster manager replaced). Run 2 writes and commits batch 0, then
    decides batch 1 and dies before its commits. Run 1's driver wakes: its decision
    transaction was fenced by run 2's claim of the decider, so it claims again, reads
    the pointer anew, finds batch 1 decided past its batch 0 and refuses its commit (a
    stale run: rule 40), moving nothing. Run 2's replay of batch 1 (with other rows: a
    non-deterministic stage) finds it decided and writes nothing; its commit ends the
    recorded transactions: each record once. Before, run 1 moved the pointer back to
    batch 0's plain offset, and the replay wrote batch 1 again over its decided
    transactions."""
    from eos_connectors.sinks.kafka import stream_decider
    from eos_connectors.sinks.kafka.decisions import read_pointer

    paused, resume = threading.Event(), threading.Event()
    read = stream_decider.Decider.read

    def pausing(decider: stream_decider.Decider) -> tuple[int, str] | None:
        pointed = read(decider)
        if threading.current_thread().name == "run-1-driver" and not paused.is_set():
            paused.set()
            assert resume.wait(60)
        return pointed

    monkeypatch.setattr(stream_decider.Decider, "read", pausing)
    stale, failed = _stale_driver(writer, _prepare(writer, 0))
    assert paused.wait(30), "run 1's driver never read the pointer"
    run_2 = BatchCommitWriter(writer.options)
    run_2.commit(list(_prepare(run_2, 0, run="run-2")), 0)
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-decision@1"):
        run_2.commit(list(_prepare(run_2, 1, run="run-2")), 1)
    resume.set()
    stale.join(60)
    assert not stale.is_alive()
    assert [type(exc) for exc in failed] == [CheckpointBehindSinkError], failed
    sid = writer.options.sink_id or ""
    assert read_pointer(writer.options, sid, stable=True) == (2, "kafka-query"), "moved back"
    replay = _prepare(run_2, 1, run="run-2b", tag="-again")
    assert [m.state for m in replay] == ["decided", "decided"]
    run_2.commit(list(replay), 1)
    assert _visible(endpoints, writer) == _expected(range(2)), "each record once"


def test_the_drivers_clients_are_kept_across_commits(writer: BatchCommitWriter) -> None:
    """A query's commits run in one Python worker Spark keeps: after the first commit,
    the next ones claim the decider no more, and make no new transaction client (a
    pointer reader made for each read was 4.5 ms of a ~15 ms commit step)."""
    from eos_connectors.sinks.kafka import coordinator, stream_decider

    pools = (stream_decider._KEPT, coordinator._KEPT)
    writer.commit(list(_prepare(writer, 0)), 0)
    made = [pool.created for pool in pools]
    for batch in (1, 2):
        writer.commit(list(_prepare(writer, batch)), batch)
    assert [pool.created for pool in pools] == made, "a commit made a client again"


def test_a_sweep_no_broker_answers_fails_no_batch_and_the_next_commit_sweeps(
    endpoints: Endpoints,
    writer: BatchCommitWriter,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sweep after a batch's commits asks every broker for its open transactions; a
    broker that does not answer (tests/system/test_distributed.py: the coordinator
    killed between the decision and the commits, which failed the query) leaves the
    batch committed, says so, and the next batch's commit sweeps the strays (a task
    partition the replay no longer had, an attempt under another attempt slot), which
    held read_committed readers back until then. ListTransactions is made to fail here;
    the commits, the strays and their aborts are the real broker's."""
    import kafka.errors

    sink_id = writer.options.sink_id
    assert sink_id is not None
    prefix = ids_prefix(writer.options, sink_id)
    # attempts the driver never heard of: strays (of task partition 1, which the replay no
    # longer has, and of 0, whose replay takes another attempt slot)
    strays = {r.txn.transactional_id for r in _prepare(writer, 0) if r.txn is not None}
    replay = _prepare(writer, 0, run="run-2", tasks=1)

    def unreachable(*_: object, **__: object) -> None:
        raise kafka.errors.KafkaConnectionError("socket disconnected")

    with monkeypatch.context() as patched:
        patched.setattr(TransactionClient, "open_transactions", unreachable)
        with caplog.at_level("WARNING", logger="eos_connectors"):
            writer.commit(list(replay), 0)
    assert "sweep of open transactions no decision names waits" in caplog.text
    client = TransactionClient(writer.options.kafka)
    try:
        assert {t.transactional_id for t in client.open_transactions(prefix)} == strays
        writer.commit(list(_prepare(writer, 1, tasks=1)), 1)
        assert client.open_transactions(prefix) == [], "the next commit swept the stray"
    finally:
        client.close()
    expected = sorted(_expected(range(1), tasks=1) + _expected(range(1, 2), tasks=1))
    assert _visible(endpoints, writer) == expected


def test_a_batch_commit_defaults_its_transaction_timeout_to_the_brokers_maximum(
    endpoints: Endpoints, writer: BatchCommitWriter
) -> None:
    """Transactions stay open until the driver commits the batch: unless the option is
    set, the sink asks the broker for the longest it allows."""
    from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

    from eos_connectors.sinks.kafka.checks import with_broker_timeout

    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    broker = next(iter(admin.list_topics(timeout=10).brokers))
    resource = ConfigResource("BROKER", str(broker))
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    maximum = int(configs["transaction.max.timeout.ms"].value)
    assert maximum != writer.options.transaction_timeout_ms, "the broker's is the default"

    raw = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": "t"}
    resolved = with_broker_timeout(writer.options, raw)
    assert resolved.transaction_timeout_ms == maximum
    assert resolved.producer_config()["transaction.timeout.ms"] == maximum
    chosen = with_broker_timeout(writer.options, {**raw, "kafka.transaction.timeout.ms": "9000"})
    assert chosen.transaction_timeout_ms == writer.options.transaction_timeout_ms


def test_eos_sinks_lists_and_resets_a_batch_commit_sink(
    endpoints: Endpoints,
    writer: BatchCommitWriter,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decision pointer and record are the sink's bookkeeping too: listed with the
    owner query and last decided batch, and forgotten by a reset, so a new query with
    the same sinkId may write (it is refused before). An attempt left open under another
    attempt slot (a zombie of the stopped query) holds an offset for its task
    partition's group: the reset ends it first, else its stable read of that group would
    wait for it and fail."""
    from eos_connectors.cli import main
    from eos_connectors.core.protocol import SinkClaimedError

    for name, value in endpoints.as_env().items():
        monkeypatch.setenv(name, value)
    sink_id = writer.options.sink_id
    assert sink_id is not None
    writer.commit(list(_prepare(writer, 0)), 0)

    def eos(*args: str) -> str:
        assert main(["sinks", *args]) == 0
        return capsys.readouterr().out

    listed = next(line for line in eos("list").splitlines() if sink_id in line)
    assert listed.split()[:4] == ["kafka", sink_id, "kafka-query", "0"], listed
    with pytest.raises(SinkClaimedError):
        writer.write_task(a_task(1, query="new-query"), iter(_rows(1, 0)))
    slot_1 = dataclasses.replace(a_task(1), task_attempt_id=1)  # not the group's own id
    zombie = writer.write_task(slot_1, iter(_rows(1, 0)))
    assert zombie.state == "prepared", "no open transaction for the reset to end"
    reset = eos("reset", sink_id, "--checkpoint-deleted", "--quiet-seconds", "0", "--yes")
    assert "bookkeeping forgotten" in reset
    assert sink_id not in eos("list")
    report = writer.write_task(a_task(0, query="new-query"), iter(_rows(0, 0)))
    assert report.state == "prepared", report.state
    writer.abort([report], 0)


@pytest.mark.cost(4)
def test_no_task_waits_for_an_open_transaction_of_its_own_batch_or_another_query(
    endpoints: Endpoints, writer: BatchCommitWriter, unique: str
) -> None:
    """Two sinks on the one default marker log: sink A's first batch is prepared in four
    tasks and left open (its driver has not decided). Sink B's first batch, four tasks
    too, prepares and commits meanwhile without waiting on any of them (a read of the
    log or of a group that waited for open transactions would hang here until A's
    transaction timeout, 60 s at least); and each of A's tasks prepared while the
    others' transactions were open. Then A commits: each sink's rows once."""

    other_topic = f"kb-other-{unique}"
    create_topic(endpoints.kafka, other_topic, 2)
    other = BatchCommitWriter(
        sink_options(
            {
                "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
                "topic": other_topic,
                "sinkId": f"kb-other-{unique}",
            }
        )
    )
    assert other.options.commit_mode == "batch", "the default mode"
    assert other.options.marker_log == writer.options.marker_log, "one marker log"
    began = time.monotonic()
    a_open = _prepare(writer, 0, tasks=4)
    b_reports = _prepare(other, 0, run="run-b", tasks=4)
    other.commit(list(b_reports), 0)
    assert time.monotonic() - began < 20, "a task or the driver waited on an open transaction"
    assert {m.state for m in a_open + b_reports} == {"prepared"}
    assert _visible(endpoints, writer) == []
    assert _visible(endpoints, other) == _expected(range(1), tasks=4)
    writer.commit(list(a_open), 0)
    assert _visible(endpoints, writer) == _expected(range(1), tasks=4)


@pytest.mark.soak  # ~20 s: waits out a transaction timeout; `make soak`
def test_a_decided_transaction_the_coordinator_timed_out_is_written_again_by_its_replay(
    endpoints: Endpoints, unique: str
) -> None:
    """A driver decides batch 0 and stalls past ``kafka.transaction.timeout.ms`` (12 s,
    the shortest that leaves a decision margin): the coordinator aborts the decided
    transactions itself. The late commit finds them fenced and unmarked, fails naming
    the setting to raise, and nothing is visible; the replay writes both task
    partitions again and its commit makes each record visible once."""

    from eos_connectors.sinks.kafka.decisions import Decision, write_decision

    # the driver's start check makes the marker log: on a new broker no test made it yet
    options = new_sink_options(
        endpoints, "kbt", unique, **{"kafka.transaction.timeout.ms": "12000"}
    )
    writer = BatchCommitWriter(options)
    sid = options.sink_id
    assert sid is not None
    prepared = _prepare(writer, 0)
    txns = {r.partition: r.txn for r in prepared if r.txn is not None}
    write_decision(options, sid, Decision(0, prepared[0].query_id, txns, 80))  # then stalls
    client = TransactionClient(options.kafka)
    try:
        deadline = time.monotonic() + 60
        ids = [t.transactional_id for t in txns.values()]

        def states() -> set[str]:
            return {str(getattr(d.state, "value", d.state)) for d in client.describe(ids).values()}

        while states() != {"CompleteAbort"}:  # the coordinator's own abort, on its timeout
            assert time.monotonic() < deadline, states()
            time.sleep(1)
    finally:
        client.close()
    with pytest.raises(KafkaSinkError, match=r"task partitions \[0, 1\].*raise that option"):
        writer.commit(list(prepared), 0)
    assert _visible(endpoints, writer) == [], "a timed-out transaction was visible"
    replay = _prepare(writer, 0, run="run-2")
    assert [m.state for m in replay] == ["prepared", "prepared"], "written again"
    writer.commit(list(replay), 0)
    assert _visible(endpoints, writer) == _expected(range(1)), "each record once"
