"""Two runs of one batch job version at once in the Kafka sink's batch commit (a scheduler
that retries a job while its first attempt still runs), on the real broker, driven
without Spark (sinks/kafka/runs.py): each run writes under its own transactional ids, only
the newest claim of the version decides, the earlier run fails with its transactions
aborted, and what is visible is one run's rows, each once, whatever the two runs' splits;
a driver paused inside its decision that wakes after a later claim cannot decide; a
decision aborted that way never passes for one when the log's records stand for the
pointer.

Cost: ~6 s in CI (three tests)."""

from __future__ import annotations

from collections.abc import Callable

import pyarrow as pa
import pytest
from confluent_kafka import Producer

from eos_connectors.core.batch_job import BatchJob, JobPlan
from eos_connectors.core.topics import read_to_end
from eos_connectors.sinks.kafka import decisions, runs
from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter, PreparedTask
from eos_connectors.sinks.kafka.coordinator import TransactionClient
from eos_connectors.sinks.kafka.decisions import (
    Decision,
    decision_group,
    decision_record,
    read_pointer,
)
from eos_connectors.sinks.kafka.options import KafkaSinkOptions, ids_prefix
from tests.kafka_sink_util import a_task, wait_for_markers

pytestmark = pytest.mark.services

VERSION = 3
VALUES = [f"v{i:03d}".encode() for i in range(60)]


@pytest.fixture
def options(batch_commit_options: KafkaSinkOptions) -> KafkaSinkOptions:
    return batch_commit_options


def _sid(options: KafkaSinkOptions) -> str:
    assert options.sink_id is not None
    return options.sink_id


def _split(tasks: int, partition: int) -> list[pa.RecordBatch]:
    """Task partition ``partition`` of the job's rows split ``tasks`` ways."""
    values = VALUES[partition::tasks]
    keys = [b"k" + v[-1:] for v in values]
    return [pa.RecordBatch.from_arrays([pa.array(keys), pa.array(values)], ["key", "value"])]


def _task(writer: BatchCommitWriter, job: BatchJob, tasks: int, partition: int) -> PreparedTask:
    task = a_task(job.version, run=job.run_id, partition=partition, query=job.query_id)
    return writer.write_as(task, iter(_split(tasks, partition)))


def _visible(options: KafkaSinkOptions) -> list[bytes]:
    assert options.topic is not None
    wait_for_markers(options.kafka, ids_prefix(options, _sid(options)))
    return sorted(r.value or b"" for r in read_to_end(options.kafka, options.topic, timeout=10))


def _open(options: KafkaSinkOptions) -> set[str]:
    client = TransactionClient(options.kafka)
    try:
        return {
            t.transactional_id for t in client.open_transactions(ids_prefix(options, _sid(options)))
        }
    finally:
        client.close()


@pytest.mark.cost(3)
def test_two_live_runs_of_a_version_in_other_splits_end_with_one_runs_rows_once(
    options: KafkaSinkOptions,
) -> None:
    """Run A (two tasks) starts; while its second task still writes, run B (three tasks,
    another split of the same rows) starts. Neither run's tasks touch the other's
    transactions (five open at once). A's commit finds a newer claim: it fails, its two
    transactions aborted. B decides: every row once (A's committed too would show twice). A late
    task of A, and a third run afterwards, find the version decided and write nothing."""
    sink = _sid(options)
    first, second = BatchCommitWriter(options), BatchCommitWriter(options)
    job_a, job_b = BatchJob(sink, VERSION, "run-a"), BatchJob(sink, VERSION, "run-b")
    assert first.plan_job(job_a) == JobPlan()
    a_reports = [_task(first, job_a, 2, 0)]
    assert second.plan_job(job_b) == JobPlan()
    assert first.run is not None and second.run is not None
    assert first.run.slot != second.run.slot, "two live runs share transactional ids"
    a_reports.append(_task(first, job_a, 2, 1))  # A's task still runs after B's claim
    b_reports = [_task(second, job_b, 3, p) for p in range(3)]
    assert {r.state for r in a_reports + b_reports} == {"prepared"}
    assert len(_open(options)) == 5, "a run's task fenced the other run's transaction"

    with pytest.raises(runs.RunSupersededError, match="started after this one"):
        first.commit(list(a_reports), VERSION)
    left = _open(options)
    assert left == {r.txn.transactional_id for r in b_reports if r.txn}, "A's not aborted"

    second.commit(list(b_reports), VERSION)
    assert _visible(options) == sorted(VALUES), "not every row exactly once"
    assert _open(options) == set()

    late = _task(first, job_a, 2, 1)
    assert late.state == "decided", "a late task of the losing run wrote"
    third = BatchCommitWriter(options)
    job_c = BatchJob(sink, VERSION, "run-c")
    assert third.plan_job(job_c) == JobPlan()
    again = [_task(third, job_c, 4, p) for p in range(4)]
    assert {r.state for r in again} == {"decided"}
    third.commit(list(again), VERSION)
    assert _visible(options) == sorted(VALUES)


@pytest.mark.cost(2)
def test_a_driver_paused_inside_its_decision_cannot_decide_after_a_later_claim(
    options: KafkaSinkOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run A's commit passes its check and claims the decider again; before its
    transaction commits (the driver paused there), run B claims the version. A's decision
    is fenced: the pointer never moves, A's transactions are aborted, and B, whose tasks
    wrote meanwhile, decides."""
    sink = _sid(options)
    first, second = BatchCommitWriter(options), BatchCommitWriter(options)
    job_a, job_b = BatchJob(sink, VERSION, "run-a"), BatchJob(sink, VERSION, "run-b")
    first.plan_job(job_a)
    a_reports = [_task(first, job_a, 2, p) for p in range(2)]
    b_reports: list[PreparedTask] = []
    record: Callable[[KafkaSinkOptions, str, Decision], tuple[str, bytes]] = decision_record

    def meanwhile(o: KafkaSinkOptions, s: str, decision: Decision) -> tuple[str, bytes]:
        second.plan_job(job_b)  # B's driver starts while A's is inside its decision
        b_reports.extend(_task(second, job_b, 3, p) for p in range(3))
        return record(o, s, decision)

    with monkeypatch.context() as patched:
        patched.setattr(decisions, "decision_record", meanwhile)
        with pytest.raises(runs.RunSupersededError, match="fenced"):
            first.commit(list(a_reports), VERSION)
    assert read_pointer(options, sink, stable=True) is None, "the fenced decision moved it"
    assert _open(options) == {r.txn.transactional_id for r in b_reports if r.txn}
    second.commit(list(b_reports), VERSION)
    assert _visible(options) == sorted(VALUES)


@pytest.mark.cost(1)
def test_an_aborted_decision_in_the_log_never_stands_for_the_pointer(
    options: KafkaSinkOptions,
) -> None:
    """A new job's sink holds no pointer offset, so the marker log's last decision record
    stands for it. A decision record written in the decider's transaction and aborted
    there (a later claim fenced it) is skipped: the version reads undecided, and a
    committed one afterwards reads decided."""
    sink = _sid(options)
    name = decision_group(options, sink)
    producer = Producer({**options.client_config(), "transactional.id": name})
    producer.init_transactions(30)
    producer.begin_transaction()
    aborted = Decision(VERSION, f"job-{sink}", {}, 0, (), (1, 1))
    key, value = decision_record(options, sink, aborted)
    producer.produce(options.marker_log, value, key.encode(), partition=0)
    assert producer.flush(30) == 0
    claim = runs.claim_run(options, sink)  # fences the producer: its transaction aborts
    assert read_pointer(options, sink) is None, "an aborted decision read as the pointer"
    runs.decide(options, sink, claim, Decision(VERSION, f"job-{sink}", {}))
    assert read_pointer(options, sink) == (VERSION + 1, f"job-{sink}")
