"""The Kafka sink's task side: one transaction per task, fenced and marked with its batch.

librdkafka cannot prepare a transaction in one process and commit it in another,
so each task commits its own transaction: the records and, inside the same
transaction, a progress marker (the committed offset ``batch + 1`` of a
sink-owned consumer group). A batch already marked is not written again.

Producers and marker consumers are pooled per Python worker (Spark reuses its
workers across tasks and batches; :class:`ClientPool`), so a task does not pay
for a new producer, its metadata and ``init_transactions()`` every batch.
Fencing still decides who may commit: ``init_transactions()`` of a producer of
the same (sink, task partition) anywhere fences every earlier one and ends its
open transaction.

A task looks where its task partition stands before any transaction, while Spark
computes its rows: a *quick* read of the marker (as the group last applied it)
refuses another query's task partition before fencing anybody, skips a marked
batch, and shows whether a pooled producer's marker moved since the producer's
own last commit (another producer of the id moved it, so fenced it: a new one is
made now, not after the rows came). A new producer is followed by a *stable*
read (``require_stable``: a broker applies a committed transaction's offsets
after it answered the commit), the only read trusted to say what to write. The
transaction begins at the first row, so time spent upstream before it does not
count against ``transaction.timeout.ms``, and a task with no rows opens none. A
pooled producer fenced without the marker moving (another attempt initialised
one and wrote nothing) fails at the transaction's first call, the marker's
offset, before any record: the task takes a new producer and looks again.

The same transaction also writes the marker as a record, keyed by the
transactional id, to a compacted *marker log* topic: group offsets expire
(``offsets.retention.minutes``) once a sink stops, the log never does, so a
marker missing from the group is looked up there before a batch counts as new.
Both carry the query id that wrote them: a marker of another query (a new
checkpoint, or a second query, with the same ``sinkId``) fails the task instead
of skipping its batches, and a task partition with no marker of its own query
first makes sure the sink id is its query's (:mod:`sinks.kafka.claim`).

Spark's abort of a failed batch ends the tasks' open transactions from the driver by
fencing their ids (``InitProducerId``), never by ``EndTxn(abort)``: a task still
writing (its executor frozen) would, under transaction protocol version 1, begin a new
transaction at its unchanged epoch with the next partition it adds, holding only what
came after the abort and no marker, and commit it; the replay would write those records
again. Fenced, its next request is refused.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from confluent_kafka import Producer
from pyspark.sql.datasource import WriterCommitMessage

from eos_connectors.core import faults, timing
from eos_connectors.core.ahead import RowsAhead
from eos_connectors.core.batch_job import BatchJob, JobPlan
from eos_connectors.core.checkpoint_behind import planned_offsets, refuse_at_commit
from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.continuous import refuse_continuous
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.protocol import Lineage, SinkClaimedError
from eos_connectors.core.spark_api import StreamArrowWriter
from eos_connectors.sinks.kafka import jobs
from eos_connectors.sinks.kafka.claim import check_owner
from eos_connectors.sinks.kafka.clients import (
    CALL_TIMEOUT,
    SEND_OFFSETS_LIMIT,
    StuckCallError,
    TransactionalProducer,
    abort_quietly,
    call,
    is_fenced,
    produce_rows,
    wait_delivered,
)
from eos_connectors.sinks.kafka.coordinator import TransactionClient
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.marker import MarkerGroup, moved
from eos_connectors.sinks.kafka.marker_log import refuse_replanned_markers
from eos_connectors.sinks.kafka.options import (
    KafkaSinkOptions,
    ids_prefix,
    transactional_id,
)
from eos_connectors.sinks.kafka.pool import CLIENTS, ClientPool

if TYPE_CHECKING:
    import pyarrow as pa

    from eos_connectors.sinks.kafka.records import Row

log = logging.getLogger(__name__)

#: How many new producers a task tries when each is found fenced at its first call.
FRESH_PRODUCER_TRIES = 3


class _StaleProducerError(KafkaSinkError):
    """A pooled producer was fenced (or broken) before its transaction wrote anything."""


class _FencedAtCommitError(KafkaSinkError):
    """The producer was found fenced at its commit: its transaction is aborted (another
    attempt fenced it) or committed after all (a commit retried when the coordinator
    moved)."""


class TaskReport(WriterCommitMessage):
    """What one task did: records written, or skipped because its batch was marked; and
    the sink id it wrote under (so the driver's abort can find the sink's open
    transactions)."""

    def __init__(
        self,
        batch_id: int,
        partition: int,
        records: int,
        skipped: bool,
        sink_id: str = "",
        marked: int = -1,
    ) -> None:
        self.batch_id = batch_id
        self.partition = partition
        self.records = records
        self.skipped = skipped
        self.sink_id = sink_id
        #: A skipped batch's marker: the next batch the task partition writes.
        self.marked = marked


def sink_id(options: KafkaSinkOptions, query_id: str) -> str:
    return options.sink_id_for(query_id)


class KafkaExactlyOnceWriter(StreamArrowWriter):
    """Exactly-once under deterministic replay.

    Guarantee: a task's records become visible to read_committed readers when
    its transaction commits, before Spark completes the batch; every record is
    written exactly once, provided a replayed batch gives each task partition the
    same records (true for eos_kafka input, whose offsets record how each batch is
    split into tasks, and deterministic stages).
    """

    def __init__(
        self,
        options: KafkaSinkOptions,
        checkpoint: str | None = None,
        planned: tuple[int, str] | None = None,
    ) -> None:
        self.options = options
        #: The query's checkpointLocation option (driver: an abort no task reported to).
        self.checkpoint_location = checkpoint
        #: A stream's batch and the digest of the source positions its ``offsets/N``
        #: plans, read by the driver when Spark makes the writer for that batch (after
        #: it wrote the file): the tasks' markers keep it (:func:`refuse_replanned_markers`).
        self.planned = planned

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        """Task: Spark's entry point; see :meth:`write_task`."""
        return self.write_task(TaskIdentity.current(), iterator)

    def write_as(self, task: TaskIdentity, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        """Task: a batch job's entry point (:mod:`eos_connectors.core.batch_job`)."""
        return self.write_task(task, iterator)

    def write_task(
        self, task: TaskIdentity, iterator: Iterator[pa.RecordBatch], pool: ClientPool | None = None
    ) -> TaskReport:
        """Task: 1. the worker's pooled producer and marker consumer for the task partition,
        if it has them; 2-5. the transaction (:meth:`_attempts`); 6. back to the pool.
        Spark's first rows are pulled on a thread meanwhile (:class:`RowsAhead`)."""
        steps = timing.TaskSteps("sink write", task.batch_id, rest="produce")
        pool = pool or CLIENTS
        sid = sink_id(self.options, task.query_id)
        name = transactional_id(self.options, sid, task.partition)
        with RowsAhead(iterator) as ahead:
            rows_in = FirstRows(steps.pulled("waiting for rows", iter(ahead)))
            pooled, marker = pool.take(self.options, name)
            try:
                report, producer = self._attempts(pooled, marker, task, rows_in, sid, steps, pool)
            except BaseException:
                pool.discard(marker)
                raise
            finally:
                steps.record()
        if producer is not None:
            pool.give_back(self.options, name, producer, marker)
        else:  # a marked batch that needed no producer
            pool.discard(marker)
        faults.point("after-commit", task.batch_id, role="worker", query=task.query_name)
        return report

    def _attempts(
        self,
        pooled: TransactionalProducer | None,
        marker: MarkerGroup,
        task: TaskIdentity,
        rows_in: FirstRows,
        sid: str,
        steps: timing.TaskSteps,
        pool: ClientPool,
    ) -> tuple[TaskReport, TransactionalProducer | None]:
        """Task: 2. where the task partition stands (:meth:`_stand`): its marker read stably,
        its owner checked, a producer fenced in where needed, all before any transaction;
        3. a marked batch, or no rows, ends here with no transaction; 4. at the first row,
        the transaction; 5. a pooled producer found fenced there after all (another
        attempt initialised one and wrote nothing) is replaced, and 2-4 run again; so is
        a new producer fenced there, up to ``FRESH_PRODUCER_TRIES`` times: when the
        transaction coordinator's broker dies while InitProducerId is in flight, the
        retried call can bump the epoch twice and fence the producer that asked."""
        producer, fresh = pooled, False
        fresh_fenced = 0
        while True:
            since = time.perf_counter()
            producer, fresh = self._stand(producer, fresh, marker, task, sid, pool)
            steps.add("marker and producer", since)
            done, owner = marker.known or (0, "")
            if done > task.batch_id and owner == task.query_id:
                log.info("batch %d partition %d is marked: skipping", task.batch_id, task.partition)
                return TaskReport(task.batch_id, task.partition, 0, True, sid, done), producer
            if done > task.batch_id:  # _stand refused another query's marker: never here
                raise SinkClaimedError(sid, Lineage(owner), task.query_id)
            if rows_in.first() is None:
                return TaskReport(task.batch_id, task.partition, 0, False, sid), producer
            assert producer is not None
            try:
                return self._attempt(producer, marker, task, rows_in, sid, steps), producer
            except _FencedAtCommitError as exc:
                return self._committed_after_all(exc, marker, task, sid, pool)
            except _StaleProducerError as exc:
                fresh_fenced += fresh
                if fresh_fenced >= FRESH_PRODUCER_TRIES:
                    raise
                kind = "new" if fresh else "pooled"
                log.info(
                    "%s producer %s is fenced (%s): initialising another", kind, marker.group, exc
                )
                producer, marker.known = None, None

    def _committed_after_all(
        self,
        exc: _FencedAtCommitError,
        marker: MarkerGroup,
        task: TaskIdentity,
        sid: str,
        pool: ClientPool,
    ) -> tuple[TaskReport, TransactionalProducer | None]:
        """Task: a producer fenced at its commit, seen when the transaction coordinator's
        broker died: the commit may have been applied before the client retried it. A
        new producer is fenced in (which ends the old transaction either way) and the
        marker read stably: the batch marked by this query means it is committed, by
        this attempt or another (a zombie's is fenced by its retry), and the task reports
        it skipped; otherwise the task fails and Spark retries it."""
        producer, _fresh = self._stand(None, False, marker, task, sid, pool)
        done, owner = marker.known or (0, "")
        if done > task.batch_id and owner == task.query_id:
            log.info(
                "batch %d partition %d is marked, by this attempt's commit after all or by "
                "another attempt's (%s): reported as skipped",
                task.batch_id,
                task.partition,
                exc,
            )
            return TaskReport(task.batch_id, task.partition, 0, True, sid, done), producer
        raise exc

    def _stand(
        self,
        producer: TransactionalProducer | None,
        fresh: bool,
        marker: MarkerGroup,
        task: TaskIdentity,
        sid: str,
        pool: ClientPool,
    ) -> tuple[TransactionalProducer | None, bool]:
        """Task: a quick read of the marker first, to refuse another query's task
        partition before fencing anybody and to skip a marked batch with no producer; a
        pooled producer whose marker moved since its own last commit (another producer of
        the id moved it, so fenced it) is dropped; a task without a producer gets a new
        one, fenced in, and reads the marker stably: only a read after its own
        init_transactions() is trusted to say what to write."""
        quick = marker.read_quick()
        check_owner(self.options, quick, sid, task.query_id)
        if producer is not None and moved(quick, marker.known):
            log.info(
                "marker %s moved since this worker's last batch: its producer is fenced",
                marker.group,
            )
            producer = None
        if producer is not None and marker.known and marker.known[1] not in ("", task.query_id):
            # the pooled producer's last marker was another query's: the sink id was reset
            # (which deleted the marker and fenced the producer) and claimed by this one
            log.info("marker %s was another query's: its producer is not reused", marker.group)
            producer, marker.known = None, None
        if producer is None and quick is not None and quick[0] > task.batch_id:
            marker.known = quick  # marked (markers only move forward): no producer needed
            return producer, fresh
        if producer is None:
            producer, fresh = pool.new_producer(self.options, marker.group), True
            marker.known = marker.read()
            check_owner(self.options, marker.known, sid, task.query_id)
        return producer, fresh

    def _attempt(
        self,
        producer: TransactionalProducer,
        marker: MarkerGroup,
        task: TaskIdentity,
        rows_in: FirstRows,
        sid: str,
        steps: timing.TaskSteps,
    ) -> TaskReport:
        """Begin with the marker's offset (a stale producer fails here, before any record),
        the marker log record, the rows, commit."""
        since = time.perf_counter()
        begin(producer, marker, task)
        began = time.monotonic()
        try:
            steps.add("begin and marker", since)
            log_marker(producer, marker, task, self._planned_over(task.batch_id))
            faults.point("before-prepare", task.batch_id, role="worker", query=task.query_name)
            from eos_connectors.sinks.kafka.records import in_order, rows  # pyarrow: tasks only

            changes = self.options.changes
            batches = rows(in_order(rows_in.all(), changes), self.options.topic, changes)
            count = finish(producer, task, batches, sid, steps)
            marker.known = (task.batch_id + 1, task.query_id)
        except Exception as exc:  # a crash (or a simulated one) leaves it open, for fencing
            if not stuck(exc):  # a call on a stuck producer waits behind the stuck one
                abort_quietly(producer)
            explain_timeout(exc, self.options, time.monotonic() - began)
            raise
        return TaskReport(task.batch_id, task.partition, count, False, sid)

    def _planned_over(self, batch: int) -> str:
        """Task: the digest :attr:`planned` holds when it is of ``batch``, else ""."""
        return self.planned[1] if self.planned and self.planned[0] == batch else ""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: nothing to do (each task committed its own transaction) but refuse an
        epoch of continuous processing (:mod:`eos_connectors.core.continuous`), and a
        batch planned again by a checkpoint behind the sink
        (:mod:`eos_connectors.core.checkpoint_behind`): one a task partition found marked
        past the next batch, or marked at it over other source positions than the
        checkpoint's ``offsets/N`` plans now (:func:`refuse_replanned_markers`)."""
        offsets = refuse_continuous(messages, batchId, self.checkpoint_location, "eos_kafka")
        reports = [m for m in messages if isinstance(m, TaskReport) and m.skipped]
        if not reports:
            return
        last = max(reports, key=lambda r: r.marked)
        refuse_at_commit("eos_kafka", last.sink_id, batchId, last.marked - 1)
        planned, skipped = planned_offsets(offsets), {r.partition for r in reports}
        refuse_replanned_markers(
            self.options, last.sink_id, batchId, planned, skipped, lenient=True
        )

    def commit_version(
        self, messages: list[WriterCommitMessage | None], version: int, planned: str = ""
    ) -> None:
        """Driver: a batch job's commit, and a stream's first step: the refusal of an epoch
        of continuous processing. ``planned`` is refused at the plan (no decision here)."""
        refuse_continuous(messages, version, self.checkpoint_location, "eos_kafka")

    def plan_job(self, job: BatchJob) -> JobPlan:
        """Driver, before any task of a batch job's run: :mod:`sinks.kafka.jobs`, after what
        the job's runs in ``commitMode=batch`` decided (:func:`jobs.batch_mode_plan`).
        ``streamCheckpoint`` is refused: no decision here keeps source positions."""
        if job.planned:
            raise ConfigError(
                "eos_kafka: option 'streamCheckpoint' needs commitMode=batch, whose decisions "
                "record the stream's source positions; commitMode=task keeps no decision. "
                "Remove the option, or use commitMode=batch. Nothing was written."
            )
        sid = sink_id(self.options, job.query_id)
        skip = jobs.batch_mode_plan(self.options, sid, job)
        if skip is not None:
            return JobPlan(skip=skip)
        return jobs.read_standing(self.options, sid, job.query_id).plan(job)

    def end_job(self, job: BatchJob, plan: JobPlan, tasks: int, complete: bool) -> None:
        """Driver, when a batch job's run ends: the job record. The task count kept is the
        version's first run's (a rerun's, when the first run's is unknown, only if it
        completed)."""
        first = (
            plan.tasks
            if plan.tasks is not None
            else (tasks if complete or not plan.written else None)
        )
        record = jobs.JobRecord(job.version, complete, first, job.query_id)
        jobs.write_record(self.options, sink_id(self.options, job.query_id), record)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: end the open transactions of the tasks Spark stopped waiting for (a
        failed or cancelled batch, ``query.stop()``), so that they hold no read_committed
        reader back until ``transaction.timeout.ms``. Every task that finished committed
        its own transaction; an open one belongs to an unfinished attempt, whose batch
        is replayed. Best effort: this mode is the fallback for a driver that may not
        reach the coordinators, so a failure is logged, and the next attempt's
        ``init_transactions()`` (or the broker's timeout) ends them instead."""
        sids = {m.sink_id for m in messages if isinstance(m, TaskReport) and m.sink_id}
        if not sids:
            unreported = self.options.unreported_sink_id(self.checkpoint_location)
            sids = {unreported} if unreported else set()
        for sid in sids:
            abort_open_transactions(self.options, sid, batchId)


#: How long the driver's abort waits for the coordinators before leaving the open
#: transactions to the next attempt (a query stop should not wait long on it).
ABORT_TIMEOUT_S = 5.0


def abort_open_transactions(options: KafkaSinkOptions, sid: str, batch_id: int) -> None:
    """Driver, on abort in the task-commit mode: every open transaction of the sink's ids
    aborted, best effort (see :meth:`KafkaExactlyOnceWriter.abort`)."""
    try:
        client = TransactionClient(options.kafka, timeout_s=ABORT_TIMEOUT_S)
        try:
            # Fenced, not aborted: see the module's docstring.
            timeout_ms = options.transaction_timeout_ms
            ended = client.sweep(ids_prefix(options, sid), [], fence_ms=timeout_ms)
        finally:
            client.close()
    except Exception as exc:  # the fallback mode's driver may not reach the coordinators
        log.warning(
            "batch %d of sink %s was aborted; its unfinished tasks' transactions could not "
            "be ended from the driver (%s): the next attempt's producers end them, else the "
            "broker after transaction.timeout.ms",
            batch_id,
            sid,
            type(exc).__name__,
        )
        return
    if ended:
        names = ", ".join(t.transactional_id for t in ended)
        log.info("batch %d aborted: ended the open transactions of %s", batch_id, names)


class FirstRows:
    """Task side: Spark's Arrow batches with the first one holding rows looked at before
    the transaction begins (so time spent upstream before the first row does not count
    against ``transaction.timeout.ms``, and a task with no rows opens no transaction)."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._first: pa.RecordBatch | None = None
        self._looked = False

    def first(self) -> pa.RecordBatch | None:
        """The first batch with rows, None when there is none (waits for Spark)."""
        if not self._looked:
            self._looked = True
            self._first = next((b for b in self._batches if b.num_rows), None)
        return self._first

    def all(self) -> Iterator[pa.RecordBatch]:
        first = self.first()
        if first is not None:
            yield first
            yield from self._batches


def stuck(exc: BaseException) -> bool:
    """Whether ``exc`` is, or comes from, a librdkafka call that never returned."""
    return isinstance(exc, StuckCallError) or isinstance(exc.__cause__, StuckCallError)


def explain_timeout(exc: Exception, options: KafkaSinkOptions, open_seconds: float) -> None:
    """A transaction open longer than ``transaction.timeout.ms`` is aborted by the broker,
    which bumps the producer's epoch: the next call fails as fenced. Say which setting to
    raise instead of leaving "fenced by a newer instance"."""
    if not isinstance(exc, KafkaSinkError) or not is_fenced(exc):
        return
    if open_seconds * 1000 < options.transaction_timeout_ms:
        return
    raise KafkaSinkError(
        f"The task's transaction was open {open_seconds:.1f} s, longer than "
        f"kafka.transaction.timeout.ms ({options.transaction_timeout_ms} ms), so the broker "
        "aborted it; nothing of it is visible and Spark retries the task. Raise the option "
        "kafka.transaction.timeout.ms above the time a task takes to write its rows (at most "
        "the broker's transaction.max.timeout.ms)."
    ) from exc


def begin(producer: TransactionalProducer, marker: MarkerGroup, task: TaskIdentity) -> None:
    """Begin, and add the marker's offset ``batch + 1``: the transaction's first broker
    call, so a fenced (pooled) producer fails here, as :class:`_StaleProducerError`,
    before any record went out."""
    producer.failures.clear()  # a pooled producer's last transaction's, aborted
    try:
        call(producer.begin_transaction, "begin_transaction")
        marker.join(
            producer,
            task.batch_id + 1,
            task.query_id,
            "send_offsets_to_transaction",
            SEND_OFFSETS_LIMIT,
        )
    except StuckCallError as exc:  # nothing written yet: another producer takes over
        raise _StaleProducerError(str(exc)) from exc
    except KafkaSinkError as exc:
        if is_fenced(exc):  # nothing to abort: the producer is done for, and is dropped
            raise _StaleProducerError(str(exc)) from exc
        raise


def log_marker(producer: Producer, marker: MarkerGroup, task: TaskIdentity, over: str) -> None:
    """The marker log record, as the transaction's first record, before any row: a new
    producer looks the log topic up and registers its partition with the transaction
    while the task still waits for rows, not inside commit (a record produced just
    before ``commit_transaction()`` held some commits up ~100 ms on a new producer).
    ``over``: the batch's source positions' digest, when known."""
    topic, key, value = marker.log_record(task.batch_id + 1, task.query_id, over)
    producer.produce(topic, value, key, partition=0)


def finish(
    producer: TransactionalProducer,
    task: TaskIdentity,
    batches: Iterator[list[Row]],
    sid: str,
    steps: timing.TaskSteps,
) -> int:
    """The records, then commit (the marker's offset and log record are in already)."""
    count = produce_rows(producer, batches)
    faults.point("after-prepare", task.batch_id, role="worker", query=task.query_name)
    began = time.perf_counter()
    where = f"Task partition {task.partition} of batch {task.batch_id}"
    wait_delivered(producer, producer.failures, where)  # a refused record, named, at once
    try:
        call(lambda: producer.commit_transaction(CALL_TIMEOUT), "commit_transaction")
    except StuckCallError as exc:  # applied or not: a new producer's fencing tells
        raise _FencedAtCommitError(str(exc)) from exc
    except KafkaSinkError as exc:
        if is_fenced(exc):
            raise _FencedAtCommitError(str(exc)) from exc.__cause__
        raise
    steps.add("commit", began)
    timing.record_commit(sid, task.batch_id, 1, time.perf_counter() - began)
    return count
