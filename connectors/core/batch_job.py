"""Batch writes (``df.write.format(...).mode("append").save()``) on the streaming protocol.

A batch job has no checkpoint, so nothing tells the rerun of a failed job what an
earlier run decided or wrote. The job therefore names itself, the way Delta Lake's
idempotent writes do (``txnAppId`` / ``txnVersion``): option ``sinkId`` says which
job it is, option ``txnVersion`` which run of its data (a number that grows with
every new load; a daily job can use the date, ``20261125``). The write is then
batch ``txnVersion`` of sink ``sinkId`` in the protocol every sink already runs
for streams (:mod:`eos_connectors.core.protocol`, the Kafka sink's markers):

* a rerun with the same ``txnVersion`` after a crash anywhere (a task, the driver
  between decision and commit, the driver after the commit) writes nothing twice:
  its tasks find the version decided or marked and write nothing, and its commit
  finishes what the decision named;
* a ``txnVersion`` at or below one already committed writes nothing (the job
  logs it as a warning): the driver finds it so before any task runs
  (:func:`plan_job`), so a rerun in another shape (more or fewer partitions) writes
  nothing either; a new load needs a new, larger number;
* the sink id is owned like a query's: a streaming query, or another job, that
  uses it is refused.

The owner recorded for the sink id is ``job-<sinkId>`` (:attr:`BatchJob.query_id`),
the same for every run of the job, so a rerun settles what an earlier run left;
each run has its own run id, so units of two runs never share a name although Spark
numbers task attempts from 0 again in a new application.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from eos_connectors.core import options as opt
from eos_connectors.core.checkpoint_behind import (
    in_foreach_batch,
    planned_offsets,
    refuse_in_foreach_batch,
    refuse_replanned_write,
)
from eos_connectors.core.checkpoint_sinks import checkpoint_files
from eos_connectors.core.context import NotInStreamingTaskError, TaskIdentity
from eos_connectors.core.driver_gc import settle
from eos_connectors.core.errors import ConfigError, EosError
from eos_connectors.core.protocol import TwoPhaseCommitWriter

log = logging.getLogger(__name__)

TXN_VERSION = opt.TXN_VERSION.name


class SinkOptions(Protocol):
    """What a batch job reads of a sink's parsed options."""

    @property
    def exactly_once(self) -> bool: ...

    @property
    def sink_id(self) -> str | None: ...


class StreamSinkWriter(Protocol):
    """What a sink's streaming writer offers a batch job: Spark's hooks."""

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage: ...

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None: ...

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None: ...


@runtime_checkable
class ExactlyOnceSinkWriter(StreamSinkWriter, Protocol):
    """An exactly-once writer also writes one task's rows under an identity it is given."""

    def write_as(self, task: TaskIdentity, iterator: Iterator[Any]) -> WriterCommitMessage: ...

    def commit_version(
        self, messages: list[WriterCommitMessage | None], version: int, planned: str = ""
    ) -> None:
        """Driver: the job's commit, without a stream's own checks (a version at or below
        a decided one is a rerun, not a checkpoint behind its sink); ``planned``: the
        stream's source positions (:attr:`BatchJob.planned`), for the decision."""


@dataclass(frozen=True)
class JobPlan:
    """What a run of a batch job does, decided on the driver before any of its tasks runs
    and shipped to them with the writer."""

    #: Why the run writes nothing ("" when it writes): its version, or a later one, was
    #: committed before.
    skip: str = ""
    #: A version partly written by tasks that commit their own writes (the Kafka sink):
    #: how many tasks its first run had, when known; a task partition at or above it
    #: refuses to write, and so does the driver's commit of a run of another size.
    tasks: int | None = None
    #: The task partitions that wrote the version already (at least ``max + 1`` tasks).
    written: tuple[int, ...] = ()
    #: The highest version the job decided or committed, when the plan read it (-1: none
    #: or unknown): a write from a stream's ``foreachBatch`` below it was planned again
    #: by a checkpoint behind the sink (:func:`refuse_in_foreach_batch`). Not part of what
    #: the run does, so plans that write alike compare equal.
    highest: int = field(default=-1, compare=False)


@runtime_checkable
class JobLedger(Protocol):
    """A sink whose tasks commit their own writes keeps, for the next run's driver, what
    each run of a job did (the Kafka sink in task-commit mode: :mod:`sinks.kafka.jobs`)."""

    def plan_job(self, job: BatchJob) -> JobPlan:
        """Driver, before any task: what this run of ``job`` writes."""
        ...

    def end_job(self, job: BatchJob, plan: JobPlan, tasks: int, complete: bool) -> None:
        """Driver, after the run's commit (``complete``) or abort: keep what it did."""
        ...


@dataclass(frozen=True)
class BatchJob:
    """One run of an exactly-once batch write: the job (``sinkId``), the version of its
    data (``txnVersion``) and this run's own id (made on the driver)."""

    sink_id: str
    version: int
    run_id: str
    #: With ``streamCheckpoint`` (a write from a stream's ``foreachBatch``): the digest of
    #: the source positions the stream's ``offsets/<version>`` plans
    #: (:func:`~eos_connectors.core.checkpoint_behind.planned_offsets`), which the version's
    #: decision records and a rerun must match; "" without.
    planned: str = ""

    @property
    def query_id(self) -> str:
        """The owner of the sink id, the same for every run of the job."""
        return f"job-{self.sink_id}"

    def task(self) -> TaskIdentity:
        """Task: the running task as a task of batch ``version`` of the job."""
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise NotInStreamingTaskError("A batch write's task ran outside a Spark task.")
        return TaskIdentity(
            query_id=self.query_id,
            query_name=self.sink_id,
            run_id=self.run_id,
            batch_id=self.version,
            partition=context.partitionId(),
            task_attempt_id=context.taskAttemptId(),
        )


def batch_job(
    options: Mapping[str, str], connector: str, exactly_once: bool, sink_id: str | None
) -> BatchJob | None:
    """Driver: the identity of an exactly-once batch write from its (lower-cased) options;
    None at least once, where nothing needs one."""
    text = _version_text(options)
    checkpoint = _option_text(options, opt.STREAM_CHECKPOINT.name)
    if not exactly_once:
        if checkpoint:
            raise ConfigError(
                f"{connector}: option '{opt.STREAM_CHECKPOINT.name}' is for exactly-once batch "
                "writes, whose decisions record the stream's source positions; an "
                "at-least-once write keeps none. Remove it."
            )
        return None
    if not sink_id or not text:
        unset = [f"'{n}'" for n, v in (("sinkId", sink_id), (TXN_VERSION, text)) if not v]
        missing = (
            f"options {' and '.join(unset)} are" if len(unset) > 1 else f"option {unset[0]} is"
        )
        raise ConfigError(
            f"{connector}: an exactly-once batch write must be known again when it is rerun "
            f"(there is no checkpoint), and {missing} not set. Set 'sinkId' to name "
            f"the job (e.g. 'orders-daily-load') and '{TXN_VERSION}' to a number that grows "
            "with every new load of its data (e.g. 20261125 for a daily load); rerun a failed "
            "load with the same number and nothing is written twice. Or set "
            "deliveryGuarantee=at-least-once."
        )
    version: int = opt.TXN_VERSION.parse(text, opt.TXN_VERSION.name)
    planned = stream_positions(connector, checkpoint, version) if checkpoint else ""
    return BatchJob(sink_id, version, uuid.uuid4().hex, planned)


def stream_positions(connector: str, checkpoint: str, version: int) -> str:
    """Driver, planning a batch write with ``streamCheckpoint``: the digest of the source
    positions the stream's ``offsets/<version>`` plans. Spark writes that file before it
    runs the batch's ``foreachBatch``, so a checkpoint that lacks it, or cannot be read,
    is a wrong option: refused, naming it."""
    name = opt.STREAM_CHECKPOINT.name
    files = checkpoint_files(checkpoint)
    if files is None:
        raise ConfigError(
            f"{connector}: option '{name}' {checkpoint!r} is not a checkpoint this package "
            "can read (a local path, file: or hdfs: with EOS_WEBHDFS_URL). Remove the option "
            "for a checkpoint on another store; a checkpoint put back by one batch is then "
            "not seen (docs/batch-writes.md)."
        )
    try:
        text = files.read(f"offsets/{version}")
    except (OSError, EosError) as exc:
        raise ConfigError(
            f"{connector}: offsets/{version} of the checkpoint in option '{name}' "
            f"({checkpoint}) could not be read: {exc}. Nothing was written."
        ) from None
    if text is None:
        raise ConfigError(
            f"{connector}: the checkpoint in option '{name}' ({checkpoint}) has no "
            f"offsets/{version}: set '{name}' to the checkpointLocation of the stream whose "
            f"foreachBatch runs this write, and '{TXN_VERSION}' to its batch id. Nothing was "
            "written."
        )
    return planned_offsets(text)


def refuse_in_stream(options: Mapping[str, str], connector: str) -> None:
    """Driver: ``txnVersion`` on a streaming query is a mistake worth saying."""
    if _version_text(options):
        raise ConfigError(
            f"Option '{TXN_VERSION}' of {connector} is for batch writes (df.write): a streaming "
            "query numbers its batches in its checkpoint. Remove the option."
        )


def refuse_overwrite(overwrite: bool, connector: str, instead: str) -> None:
    """Driver: ``mode("overwrite")`` would need the target emptied in the same commit."""
    if overwrite:
        raise ConfigError(
            f"{connector} writes batches with save mode 'append' only (.mode(\"append\")); "
            f"'overwrite' is not supported: {instead}."
        )


class SinkFormat(DataSource):
    """A sink's format: streams and batch writes through one ``_writer``, the sink's
    streaming writer (its checks run on the driver when it is built)."""

    #: The sink's name in messages, and what to do instead of ``mode("overwrite")``.
    connector = "this sink"
    instead_of_overwrite = "append instead"

    @property
    def sink_config(self) -> SinkOptions:
        """Driver: the sink's parsed options (no network call)."""
        raise NotImplementedError

    def _writer(self, schema: StructType, overwrite: bool) -> Any:
        """Driver: the sink's streaming writer for ``schema`` (``overwrite``: complete mode)."""
        raise NotImplementedError

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Driver: check the options against the stream, run the start checks once per
        driver, and return the writer (its ``write`` runs in tasks). Spark calls it twice
        a batch, in processes it keeps (:func:`~eos_connectors.core.driver_gc.settle`)."""
        settle()
        refuse_in_stream(self.options, self.connector)
        writer: DataSourceStreamWriter = self._writer(schema, overwrite)
        return writer

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """Driver: a batch write (``df.write``) as batch ``txnVersion`` of job ``sinkId``:
        Overwrite and the job's identity checked first, before any network call or DDL,
        then the sink's streaming writer (its checks run), wrapped for the job."""
        settle()
        refuse_overwrite(overwrite, self.connector, self.instead_of_overwrite)
        options = self.sink_config
        job = batch_job(self.options, self.connector, options.exactly_once, options.sink_id)
        stream: StreamSinkWriter = self._writer(schema, False)
        plan = plan_job(stream, job, self.connector) if job is not None else JobPlan()
        return BatchWriter(stream, job, plan, self.connector)


def plan_job(stream: StreamSinkWriter, job: BatchJob, connector: str) -> JobPlan:
    """Driver, before any task of the run: earlier versions settled, then whether this
    version writes at all. A version at or below a committed one writes nothing, whatever
    the shape of this run (its tasks are not asked: a task partition the earlier run did
    not have would find nothing and write)."""
    if isinstance(stream, TwoPhaseCommitWriter):
        settle_earlier_versions(stream, job, connector)
        return _two_phase_plan(stream, job, connector)
    if isinstance(stream, JobLedger):
        return stream.plan_job(job)
    return JobPlan()


def _two_phase_plan(stream: TwoPhaseCommitWriter, job: BatchJob, connector: str) -> JobPlan:
    """Driver: a version at or below the job's applied one writes nothing. A decided
    version runs as usual: its tasks find the decision and write nothing, in any shape,
    and the commit applies what the decision names (a driver that died between
    decision and commit); unless, with ``streamCheckpoint``, the decision recorded other
    source positions than the stream plans for the batch now (refused)."""
    sink_id = stream.sink_id(job.query_id)
    stream.check_owner(sink_id, job.query_id)
    applied = stream.applied_watermark(sink_id, job.query_id)
    recorded = stream.find_decision(sink_id, job.version)
    if recorded is not None:
        refuse_replanned_write(connector, sink_id, job.version, recorded.offsets, job.planned)
        return JobPlan(highest=applied)
    if job.version <= applied:
        return JobPlan(skip=f"{TXN_VERSION} {applied} was committed before", highest=applied)
    return JobPlan(highest=applied)


def settle_earlier_versions(stream: TwoPhaseCommitWriter, job: BatchJob, connector: str) -> None:
    """Driver, before any task of version ``job.version`` runs: earlier versions of the job
    left in doubt are applied first when decided (a driver that died between decision
    and commit), so they never land over this version; an earlier version prepared and
    undecided (still running, or its driver died before deciding) refuses this run,
    naming it: rolling it back would lose a load its run may still report as written."""
    sink_id = stream.sink_id(job.query_id)
    earlier = [
        u
        for u in stream.units_in_doubt(sink_id)
        if u.batch_id < job.version and u.made_by(job.query_id)
    ]
    versions = sorted({u.batch_id for u in earlier})
    undecided = [v for v in versions if stream.find_decision(sink_id, v) is None]
    if undecided:
        shown = ", ".join(map(str, undecided))
        raise ConfigError(
            f"{connector}: {TXN_VERSION} {shown} of job {sink_id!r} has prepared writes and no "
            "decision: a run of it is still going, or its driver died before it decided. "
            f"Nothing of {TXN_VERSION} {job.version} was written. Let that run finish, or rerun "
            f"{TXN_VERSION} {undecided[0]} (it settles what the dead run left), or discard that "
            f"load with `eos sinks settle {sink_id}`; then run {TXN_VERSION} {job.version} again."
        )
    if versions:
        log.info("sink %s: applying decided versions %s first", sink_id, versions)
        stream.recover(sink_id, job.version - 1)


class SkippedTask(WriterCommitMessage):
    """A task of a run that writes nothing (:attr:`JobPlan.skip`)."""

    skipped = True


class FromForeachBatch(WriterCommitMessage):
    """A task's message (``message``) from a write inside a stream's ``foreachBatch``
    with ``txnVersion`` its batch id and no ``streamCheckpoint``: the driver's commit
    unwraps it and warns (:func:`unwrapped`)."""

    def __init__(self, message: WriterCommitMessage) -> None:
        self.message = message


#: Sink ids this driver-side process has warned of (:func:`unwrapped`), once each.
_WARNED: set[str] = set()


def unwrapped(
    messages: list[WriterCommitMessage | None], job: BatchJob, connector: str
) -> list[WriterCommitMessage | None]:
    """Driver: the tasks' own messages. When one came from a stream's ``foreachBatch``
    (:class:`FromForeachBatch`), warn once a sink id that ``streamCheckpoint`` is unset:
    the write cannot tell that stream's batch planned again over other positions (its
    checkpoint put back by exactly one batch) from a rerun, and would write nothing of
    it."""
    if job.sink_id not in _WARNED and any(isinstance(m, FromForeachBatch) for m in messages):
        _WARNED.add(job.sink_id)
        log.warning(
            "%s: job %r runs in a stream's foreachBatch (txnVersion %d is its batch "
            "id) without option '%s': a stream checkpoint put back by exactly one "
            "batch would have this write take the replanned batch for a rerun and "
            "write nothing of it. Set '%s' to the stream's checkpointLocation "
            "(docs/batch-writes.md).",
            connector,
            job.sink_id,
            job.version,
            opt.STREAM_CHECKPOINT.name,
            opt.STREAM_CHECKPOINT.name,
        )
    return [m.message if isinstance(m, FromForeachBatch) else m for m in messages]


class BatchWriter(DataSourceArrowWriter):
    """``df.write`` through a sink's streaming writer: the whole job is batch
    ``txnVersion`` of the protocol (exactly once), or plain task writes (``job`` None,
    at least once)."""

    def __init__(
        self,
        stream: StreamSinkWriter,
        job: BatchJob | None,
        plan: JobPlan | None = None,
        connector: str = "this sink",
    ) -> None:
        self.stream = stream
        self.job = job
        self.plan = plan or JobPlan()
        self.connector = connector

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        """Task: the sink's task write, as a task of the job's batch; nothing in a run
        that writes nothing, and a refusal in a task partition a partly written
        version's first run did not have. First, inside a stream's ``foreachBatch`` with
        ``txnVersion`` its batch id, a version below the job's highest is refused (the
        stream's checkpoint is behind the sink: :mod:`.checkpoint_behind`)."""
        if self.job is None:
            return self.stream.write(iterator)
        job = self.job
        refuse_in_foreach_batch(self.connector, job.sink_id, job.version, self.plan.highest)
        if self.plan.skip:
            return SkippedTask()
        task = self.job.task()
        if self.plan.tasks is not None and task.partition >= self.plan.tasks:
            raise self._other_shape(f"has task partition {task.partition}")
        assert isinstance(self.stream, ExactlyOnceSinkWriter)
        message = self.stream.write_as(task, iterator)
        if not job.planned and in_foreach_batch(job.version):
            return FromForeachBatch(message)
        return message

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver: the protocol's commit of the job's batch (one decision for the job)."""
        job = self.job
        if job is not None:
            messages = unwrapped(messages, job, self.connector)
        if job is not None and self.plan.skip:
            log.warning(
                "sink %s: %s, so %s %d wrote nothing (a rerun, or a number used again). A new "
                "load needs a larger %s.",
                job.sink_id,
                self.plan.skip,
                TXN_VERSION,
                job.version,
                TXN_VERSION,
            )
            return
        too_few = len(messages) <= max(self.plan.written, default=-1)
        if job is not None and (too_few or self.plan.tasks not in (None, len(messages))):
            raise self._other_shape(f"has {len(messages)} tasks")
        if job is not None and isinstance(self.stream, ExactlyOnceSinkWriter):
            self.stream.commit_version(messages, job.version, job.planned)
        else:
            self.stream.commit(messages, self._batch_id())
        if job is not None and isinstance(self.stream, JobLedger):
            self.stream.end_job(job, self.plan, len(messages), complete=True)
        if job is not None and messages and all(_skipped(m) for m in messages):
            log.warning(
                "sink %s: %s %d was committed before (a rerun): nothing more was written.",
                job.sink_id,
                TXN_VERSION,
                job.version,
            )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver: the protocol's abort (rolls back what the job's tasks prepared)."""
        if self.job is not None:
            messages = unwrapped(messages, self.job, self.connector)
        self.stream.abort(messages, self._batch_id())
        if self.job is not None and not self.plan.skip and isinstance(self.stream, JobLedger):
            self.stream.end_job(self.job, self.plan, len(messages), complete=False)

    def _other_shape(self, found: str) -> ConfigError:
        """The refusal of a run split otherwise than the partly written version it reruns."""
        assert self.job is not None
        first = f"{self.plan.tasks} tasks" if self.plan.tasks is not None else "more tasks"
        return ConfigError(
            f"{TXN_VERSION} {self.job.version} of job {self.job.sink_id!r} was partly written "
            f"(task partitions {', '.join(map(str, self.plan.written))} committed) by a run of "
            f"{first}, and this run {found}: its tasks commit their own writes, so a rerun "
            "must split the rows exactly as that run did, or rows are written twice or never. "
            "Rerun it with the same input and "
            + (
                f".repartition({self.plan.tasks}) (the same partitioning as the first run)."
                if self.plan.tasks is not None
                else "the first run's partitioning."
            )
        )

    def _batch_id(self) -> int:
        return self.job.version if self.job is not None else 0


def _version_text(options: Mapping[str, str]) -> str:
    return _option_text(options, TXN_VERSION)


def _option_text(options: Mapping[str, str], name: str) -> str:
    return next((v.strip() for k, v in options.items() if k.lower() == name.lower()), "")


def _skipped(message: WriterCommitMessage | None) -> bool:
    return bool(getattr(message, "skipped", False))
