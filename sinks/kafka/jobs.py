"""Driver: what earlier runs of a Kafka batch job wrote, read before any task of a run.

The Kafka sink's tasks commit their own transactions (:mod:`sinks.kafka.exactly_once`),
so the driver of a job's run cannot settle the job the way the PostgreSQL and Redis
sinks do; it reads what the runs left instead, in the marker log, before any task
runs:

* each task partition's marker: the highest ``txnVersion`` it wrote (its transaction
  wrote the marker);
* the job record, ``<prefix>-<sinkId>-job``, written by the driver when a run ends:
  the version, whether the run completed, and how many tasks the version's first run
  had.

A version at or below a completed one, or below a version any task partition wrote,
writes nothing, in any shape (:class:`JobPlan.skip`). A version partly written (some
task partitions committed, the run failed or its driver died) is rerun only in the
shape of its first run: task partitions beyond it refuse before writing, and so does
the driver's commit of a run of another size. A rerun with fewer or more partitions
whose tasks all fall inside the first run's count cannot be told apart by any task
(Spark does not tell a task how many there are): docs/batch-writes.md says so, and
issue 53's driver commit lifts the rule.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from eos_connectors.core.batch_job import TXN_VERSION, BatchJob, JobPlan
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.kafka_config import logged
from eos_connectors.core.topics import Record
from eos_connectors.sinks.kafka.decisions import read_decision, read_pointer, uncommitted
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.marker_log import decode, read_for, read_settled
from eos_connectors.sinks.kafka.options import KafkaSinkOptions

log = logging.getLogger(__name__)

#: The job record's key in the marker log: ``<prefix>-<sinkId>`` and this.
JOB_SUFFIX = "-job"
#: Seconds a job record's write (or its tombstone's) may take.
WRITE_TIMEOUT = 30.0


@dataclass(frozen=True)
class JobRecord:
    """The last run of a job, as its driver left it."""

    version: int
    complete: bool
    tasks: int | None  # the version's first run's task count, when known
    query: str


@dataclass(frozen=True)
class JobStanding:
    """A job's marks in the marker log: per task partition the highest version it wrote,
    and the job record."""

    written: dict[int, int]
    record: JobRecord | None

    def plan(self, job: BatchJob) -> JobPlan:
        """Driver: what a run of ``job.version`` writes (see the module's docstring)."""
        version, record = job.version, self.record
        highest = max(self.written.values(), default=-1)
        if highest > job.version:
            return JobPlan(skip=f"{TXN_VERSION} {highest} was written before", highest=highest)
        if record is not None and record.complete and record.version >= version:
            return JobPlan(
                skip=f"{TXN_VERSION} {record.version} was committed before",
                highest=max(highest, record.version),
            )
        if record is not None and not record.complete and record.version < version:
            raise ConfigError(
                f"eos_kafka: {TXN_VERSION} {record.version} of job {job.sink_id!r} was partly "
                f"written (its run failed) and never completed. Nothing of {TXN_VERSION} "
                f"{version} was written. Rerun {TXN_VERSION} {record.version} first, with the "
                "same input and partitioning, then this one."
            )
        written = tuple(sorted(p for p, v in self.written.items() if v == version))
        if not written:
            return JobPlan()
        tasks = record.tasks if record is not None and record.version == version else None
        return JobPlan(tasks=tasks, written=written)


def job_key(options: KafkaSinkOptions, sink_id: str) -> bytes:
    return f"{options.transactional_id_prefix}-{sink_id}{JOB_SUFFIX}".encode()


def read_standing(options: KafkaSinkOptions, sink_id: str, query_id: str) -> JobStanding:
    """Driver: the job's task partitions' markers and its job record, read from the marker
    log once every transaction open on it has ended."""
    records = read_settled(options, f"the runs of job {sink_id!r}")
    return _standing(options, sink_id, query_id, records)


def batch_mode_plan(options: KafkaSinkOptions, sink_id: str, job: BatchJob) -> str | None:
    """Driver, before a run of ``job`` in ``commitMode=task``: what the job's runs in
    ``commitMode=batch`` decided (:mod:`.decisions`), which the task partitions' markers
    of this mode do not hold. Why the run writes nothing (this version or a later one was
    decided and committed), else None. A last decision whose driver died before
    committing all of it is refused: only a run in the batch commit finishes it, and
    meanwhile its transactions hold read_committed readers back until they time out."""
    pointed = read_pointer(options, sink_id)
    if pointed is None or pointed[1] != job.query_id:
        return None
    last = pointed[0] - 1
    left = uncommitted(options, read_decision(options, sink_id, last))
    if left:
        raise ConfigError(
            f"eos_kafka: {TXN_VERSION} {last} of job {sink_id!r} was decided in "
            f"commitMode=batch and its driver stopped before committing task partitions "
            f"{left}: only a run with commitMode=batch commits them. Run the job with "
            f"commitMode=batch ({TXN_VERSION} {last} again, or the next one), then switch. "
            "Nothing was written."
        )
    if job.version <= last:
        return f"{TXN_VERSION} {last} was committed before (in commitMode=batch)"
    return None


def task_mode_plan(options: KafkaSinkOptions, sink_id: str, job: BatchJob) -> str | None:
    """Driver, before a run of ``job`` in ``commitMode=batch``: what the job's runs in
    ``commitMode=task`` left, whose markers and job record the batch commit's decisions do
    not hold. Why the run writes nothing (task mode wrote this version or a later one),
    else None; a version task mode wrote in part, this one or an earlier one, is refused:
    only a task-mode rerun in its first run's shape finishes it. The log is read without
    waiting for transactions that cannot hide the job's records (:func:`read_for`)."""
    keys = _task_mode_keys(options, sink_id)
    records = read_for(options, keys, f"the runs of job {sink_id!r}")
    plan = _standing(options, sink_id, job.query_id, records).plan(job)
    if plan.skip:
        return f"{plan.skip} (in commitMode=task)"
    if plan.written:
        raise ConfigError(
            f"eos_kafka: {TXN_VERSION} {job.version} of job {sink_id!r} was partly written in "
            f"commitMode=task (task partitions {list(plan.written)}) and never completed. "
            "This run, in commitMode=batch, would write those partitions again. Rerun the "
            "version with commitMode=task, with the same input and partitioning, then switch. "
            "Nothing was written."
        )
    return None


def _task_mode_keys(options: KafkaSinkOptions, sink_id: str) -> Callable[[bytes], bool]:
    """The marker log keys of a job's task-mode runs: its task partitions' markers
    (``<prefix>-<sink id>-<task partition>``) and its job record."""
    prefix, record = (
        f"{options.transactional_id_prefix}-{sink_id}-".encode(),
        job_key(options, sink_id),
    )

    def holds(key: bytes) -> bool:
        tail = key[len(prefix) :] if key.startswith(prefix) else b""
        return key == record or (tail.isdigit() and tail.isascii())

    return holds


def _standing(
    options: KafkaSinkOptions, sink_id: str, query_id: str, records: list[Record]
) -> JobStanding:
    """The job's standing in ``records`` of the marker log (oldest first)."""
    prefix = f"{options.transactional_id_prefix}-{sink_id}-"
    key = job_key(options, sink_id)
    written: dict[int, int] = {}
    record: JobRecord | None = None
    for found in records:
        name = (found.key or b"").decode(errors="replace")
        if found.key == key:
            record = _decode_record(found.value) if found.value else None
            continue
        suffix = name[len(prefix) :] if name.startswith(prefix) else ""
        if not suffix.isdecimal() or not suffix.isascii():
            continue
        marker = decode(found.value) if found.value else None
        if marker is None or marker.query != query_id:
            written.pop(int(suffix), None)
            continue
        written[int(suffix)] = marker.next_batch - 1
    if record is not None and record.query != query_id:
        record = None
    return JobStanding(written, record)


def write_record(options: KafkaSinkOptions, sink_id: str, record: JobRecord) -> None:
    """Driver: the job record; a failure says what the next run will not know."""
    value = json.dumps(
        {
            "job_version": record.version,
            "complete": record.complete,
            "tasks": record.tasks,
            "query": record.query,
        }
    ).encode()
    key = job_key(options, sink_id)
    failed = put_record(options.producer_config(), options.marker_log, key, value)
    if failed:
        raise KafkaSinkError(
            f"Recording the end of {TXN_VERSION} {record.version} of job {sink_id!r} in the "
            f"marker log {options.marker_log!r} failed ({failed}). The records the job's tasks "
            "committed stay; a rerun of this version with the same partitioning writes nothing "
            "twice."
        )


def put_record(config: dict[str, Any], topic: str, key: bytes, value: bytes | None) -> str:
    """One record (``None``: a tombstone) on partition 0 of ``topic``, produced
    idempotently and flushed: "" when written, else why not."""
    failures: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failures.append(error)

    producer = Producer(logged({**config, "enable.idempotence": True, "log_level": 3}))
    producer.produce(topic, value, key, partition=0, on_delivery=delivered)
    left = producer.flush(WRITE_TIMEOUT)
    if failures:
        return str(failures[0].str())
    return f"not delivered in {WRITE_TIMEOUT:.0f} s" if left else ""


def _decode_record(value: bytes) -> JobRecord | None:
    try:
        saved = json.loads(value)
        tasks = saved.get("tasks")
        return JobRecord(
            int(saved["job_version"]),
            bool(saved["complete"]),
            None if tasks is None else int(tasks),
            str(saved["query"]),
        )
    except (ValueError, TypeError, KeyError, AttributeError):
        log.warning("the job record %r is not one this version reads: ignored", value[:80])
        return None
