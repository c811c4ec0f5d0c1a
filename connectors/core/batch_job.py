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
  logs it as a warning): a new load needs a new, larger number;
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
from dataclasses import dataclass
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
from eos_connectors.core.context import NotInStreamingTaskError, TaskIdentity
from eos_connectors.core.errors import ConfigError
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


@dataclass(frozen=True)
class BatchJob:
    """One run of an exactly-once batch write: the job (``sinkId``), the version of its
    data (``txnVersion``) and this run's own id (made on the driver)."""

    sink_id: str
    version: int
    run_id: str

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
    if not exactly_once:
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
    return BatchJob(sink_id, version, uuid.uuid4().hex)


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
        driver, and return the writer (its ``write`` runs in tasks)."""
        refuse_in_stream(self.options, self.connector)
        writer: DataSourceStreamWriter = self._writer(schema, overwrite)
        return writer

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """Driver: a batch write (``df.write``) as batch ``txnVersion`` of job ``sinkId``:
        Overwrite and the job's identity checked first, before any network call or DDL,
        then the sink's streaming writer (its checks run), wrapped for the job."""
        refuse_overwrite(overwrite, self.connector, self.instead_of_overwrite)
        options = self.sink_config
        job = batch_job(self.options, self.connector, options.exactly_once, options.sink_id)
        stream: StreamSinkWriter = self._writer(schema, False)
        if job is not None and isinstance(stream, TwoPhaseCommitWriter):
            settle_earlier_versions(stream, job, self.connector)
        return BatchWriter(stream, job)


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


class BatchWriter(DataSourceArrowWriter):
    """``df.write`` through a sink's streaming writer: the whole job is batch
    ``txnVersion`` of the protocol (exactly once), or plain task writes (``job`` None,
    at least once)."""

    def __init__(self, stream: StreamSinkWriter, job: BatchJob | None) -> None:
        self.stream = stream
        self.job = job

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        """Task: the sink's task write, as a task of the job's batch."""
        if self.job is None:
            return self.stream.write(iterator)
        assert isinstance(self.stream, ExactlyOnceSinkWriter)
        return self.stream.write_as(self.job.task(), iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver: the protocol's commit of the job's batch (one decision for the job)."""
        self.stream.commit(messages, self._batch_id())
        if self.job is not None and messages and all(_skipped(m) for m in messages):
            log.warning(
                "sink %s: %s %d was committed before (a rerun, or a number used again): "
                "nothing was written. A new load needs a larger %s.",
                self.job.sink_id,
                TXN_VERSION,
                self.job.version,
                TXN_VERSION,
            )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Driver: the protocol's abort (rolls back what the job's tasks prepared)."""
        self.stream.abort(messages, self._batch_id())

    def _batch_id(self) -> int:
        return self.job.version if self.job is not None else 0


def _version_text(options: Mapping[str, str]) -> str:
    return next((v.strip() for k, v in options.items() if k.lower() == TXN_VERSION.lower()), "")


def _skipped(message: WriterCommitMessage | None) -> bool:
    return bool(getattr(message, "skipped", False))
