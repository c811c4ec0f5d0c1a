"""A Kafka batch job (``df.write`` with ``sinkId``/``txnVersion``) whose ``commitMode``
changes between runs, on the real broker, driven without Spark: each mode keeps what a run
wrote in its own records (the batch commit its decisions, the task commit its task
partitions' markers and job record), and each reads the other's before a run, so a
version written in one mode is never written again in the other; a version one mode left
unfinished is refused in the other, naming the mode that finishes it.

Cost: ~5 s in CI (two tests)."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest

from eos_connectors.core import faults
from eos_connectors.core.batch_job import BatchJob, JobPlan
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.topics import read_to_end
from eos_connectors.sinks.kafka import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter
from eos_connectors.sinks.kafka.options import KafkaSinkOptions, ids_prefix
from tests.kafka_sink_util import a_task, wait_for_markers

pytestmark = pytest.mark.services

TASKS = 2
Writer = BatchCommitWriter | KafkaExactlyOnceWriter


def _rows(version: int, partition: int) -> pa.RecordBatch:
    values = [f"v{version}-p{partition}-r{i}".encode() for i in range(20)]
    keys = [f"k{i % 3}".encode() for i in range(20)]
    return pa.RecordBatch.from_arrays([pa.array(keys), pa.array(values)], ["key", "value"])


def _run(writer: Writer, job: BatchJob, crash: str = "") -> JobPlan:
    """One run of ``job`` as core.batch_job drives it: the plan, every task, the commit
    and the job's end. ``crash``: the driver dies at that point of its commit, or
    ``before-end``: after its commit, before the job's end is recorded."""
    plan = writer.plan_job(job)
    if plan.skip:
        return plan
    query, version = job.query_id, job.version
    tasks = [a_task(version, run=job.run_id, partition=p, query=query) for p in range(TASKS)]
    messages = [writer.write_as(t, iter([_rows(version, t.partition)])) for t in tasks]
    if crash not in ("", "before-end"):
        with pytest.raises(faults.SimulatedCrash), faults.simulate(f"{crash}@{version}"):
            writer.commit(list(messages), version)  # type: ignore[arg-type]
        return plan
    writer.commit(list(messages), version)  # type: ignore[arg-type]
    if not crash:
        writer.end_job(job, plan, TASKS, complete=True)
    return plan


def _visible(options: KafkaSinkOptions) -> list[bytes]:
    assert options.topic is not None and options.sink_id is not None
    wait_for_markers(options.kafka, ids_prefix(options, options.sink_id))
    return sorted(r.value or b"" for r in read_to_end(options.kafka, options.topic, timeout=10))


def _expected(*versions: int) -> list[bytes]:
    rows = [_rows(v, p).column("value").to_pylist() for v in versions for p in range(TASKS)]
    return sorted(value for values in rows for value in values)


@pytest.fixture
def modes(
    batch_commit_options: KafkaSinkOptions,
) -> tuple[BatchCommitWriter, KafkaExactlyOnceWriter]:
    task_mode = replace(batch_commit_options, commit_mode="task")
    return BatchCommitWriter(batch_commit_options), KafkaExactlyOnceWriter(task_mode)


@pytest.mark.cost(2)
def test_a_jobs_version_is_written_once_whichever_mode_reruns_it(
    modes: tuple[BatchCommitWriter, KafkaExactlyOnceWriter],
) -> None:
    """Version 5 in the batch commit, rerun in the task commit: skipped. Version 6 in the
    task commit, rerun in the batch commit: skipped. Version 7 in the batch commit again
    runs. Each record once (before the modes read each other's records, both reruns
    wrote their version a second time: 320 records for 160)."""
    batch, task = modes
    sink = batch.options.sink_id
    assert sink is not None
    _run(batch, BatchJob(sink, 5, "run-a"))
    assert _run(task, BatchJob(sink, 5, "run-b")).skip == (
        "txnVersion 5 was committed before (in commitMode=batch)"
    )
    assert _run(task, BatchJob(sink, 6, "run-c")) == JobPlan()
    assert _run(batch, BatchJob(sink, 6, "run-d")).skip == (
        "txnVersion 6 was committed before (in commitMode=task)"
    )
    assert _run(batch, BatchJob(sink, 7, "run-e")) == JobPlan()
    assert _visible(batch.options) == _expected(5, 6, 7), "a version written twice"


@pytest.mark.cost(3)
def test_a_version_one_mode_left_unfinished_is_refused_in_the_other(
    modes: tuple[BatchCommitWriter, KafkaExactlyOnceWriter],
) -> None:
    """Version 5's driver dies after its decision in the batch commit: the task commit
    refuses version 5 and 6 (no task-mode driver commits the decision), and the batch
    commit's next run commits 5 first. Version 8's driver dies in the task commit after
    its tasks committed, before the job's end was recorded: the batch commit refuses 8
    (it would write the committed task partitions again), and the task commit's rerun
    finds it written. Each record once."""
    batch, task = modes
    sink = batch.options.sink_id
    assert sink is not None
    _run(batch, BatchJob(sink, 5, "run-a"), crash="after-decision")
    for version in (5, 6):
        with pytest.raises(ConfigError, match=r"txnVersion 5 .* decided in commitMode=batch"):
            task.plan_job(BatchJob(sink, version, f"run-{version}"))
    assert _run(batch, BatchJob(sink, 6, "run-b")) == JobPlan()  # commits 5, then writes 6
    assert _run(task, BatchJob(sink, 7, "run-c")) == JobPlan()
    _run(task, BatchJob(sink, 8, "run-d"), crash="before-end")
    with pytest.raises(ConfigError, match=r"txnVersion 8 .* partly written in commitMode=task"):
        batch.plan_job(BatchJob(sink, 8, "run-e"))
    assert _run(task, BatchJob(sink, 8, "run-f")).written == (0, 1)
    assert _visible(batch.options) == _expected(5, 6, 7, 8), "a record lost or written twice"
