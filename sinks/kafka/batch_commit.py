"""The Kafka sink's batch commit (``commitMode=batch``): tasks prepare, the driver commits.

Each task attempt writes under its task partition's transactional id with the attempt's
slot (``<prefix>-<sink id>-<partition>a<slot>``, none for slot 0:
:func:`~.options.attempt_slot`); every attempt of a task partition marks one progress
marker (:class:`~.marker.MarkerGroup`, the id without its slot). Two live attempts of one
task partition (a stage resubmitted after an executor was lost runs it again while the
first attempt still runs; Spark keeps whichever reaches its output commit coordinator
first) thus never fence each other: with one id, the later attempt's
``InitProducerId`` aborted the transaction of the attempt Spark kept, and the batch
failed after its decision. The loser's transaction is a stray the driver's sweep ends.
Attempts whose task attempt ids are equal modulo :data:`~.options.ATTEMPT_SLOTS` still
share an id, and then fence as before (nothing lost; the query fails once, below).
What changes against ``commitMode=task`` is who ends the transaction:

1. **Task.** Where the task partition stands: its marker read quickly (a marked batch
   is skipped; another query's refused) and the sink's *decision pointer* (the committed
   offset ``batch + 1`` of the group ``<prefix>-<sink id>-decision``, plain, outside any
   transaction). A batch already decided is never touched: the task reports it and
   returns without ``InitProducerId`` on its id, which would abort the decided
   transaction if it were the same id. Otherwise a new producer of the attempt's id is
   fenced in (ending that id's earlier open transaction only), and the transaction
   written: the marker's offset first, then the rows; flushed, every delivery checked
   (a failed record aborts it and fails the task). The task returns the transaction's identity
   (id, producer id, epoch, read from its own client: :mod:`.txn_identity`) and leaves
   it **open**: nothing of it is visible.
2. **Driver, the decision.** The batch's transactions go to the marker log as one
   record keyed ``<prefix>-<sink id>-decision`` and the pointer moves to ``batch + 1``,
   in one transaction of the driver's claim of the sink's decider, the transactional
   id of the same name (:mod:`.stream_decider`; a batch job's run: :mod:`.runs`): its
   commit is the decision point, and a later claimer fences it, so a driver of an
   earlier run that read the pointer before it paused never moves it back. A driver
   that died before it leaves an undecided batch: the replay's tasks fence the open
   transactions and write again, whatever the replay's split or expressions.
3. **Driver, the commits.** ``EndTxn(commit)`` for each named transaction
   (:mod:`.coordinator`), after a look for any begun again ("Re-begun transactions"
   below); records of the batch become visible within the round trips to
   their coordinators. Then a sweep aborts the sink's open transactions that no decision
   names (a zombie's, a dead attempt's) and that began before the driver's call
   ("Sweeps" below); a broker that does not answer the listing (a coordinator that just
   died) fails nothing: the next commit sweeps again. A commit answered "fenced", or
   refused as ended the other way at its epoch, is checked by the transaction's marker:
   marked means committed before (a repeat); unmarked means a decided transaction was
   aborted (the coordinator's timeout, an attempt that initialised the id between the
   task's look at the pointer and the decision, another client's abort): the driver
   amends the decision to ask for those task partitions again (``rewrite``) and fails
   naming them; the replay's tasks of those partitions write again, the others stay
   decided, and the commit names the new transactions.
4. **Recovery.** A driver that died after the decision finds it on the replay: its tasks
   see the batch decided and write nothing, and the commit sends the recorded
   ``EndTxn(commit)`` again (a repeat is harmless).

``abort`` (Spark's, when the batch's write fails or the query is stopped mid-batch)
ends every open transaction of the sink's ids begun before its call while the batch is
undecided, those of tasks that never reported too (the sink id found through the query
id in the checkpoint when no task reported), by fencing each id (``InitProducerId``):
a task still writing is refused, where after an ``EndTxn(abort)`` it would begin a new
transaction ("Re-begun transactions"). A decided batch is never touched.

**Re-begun transactions.** Under transaction protocol version 1 another client's
``EndTxn(abort)`` moves no epoch, and the next partition a producer adds after it begins
a new transaction at the same epoch, which holds only what the task wrote after the
abort; the task cannot tell, and reports the same producer id and epoch. Committed, it
would make part of the task partition's rows visible and lose the rest. So the marker's
offset is a transaction's first part: one begun again lacks it. Before its commits the
driver describes the decided transactions (one DescribeTransactions per coordinator);
one ongoing at its own epoch with no offsets partition is aborted and judged as an
``INVALID_TXN_STATE`` refusal is, by its marker: the replay writes it again.

**Sweeps** (after a commit, before a refused decision, in ``abort``; and at a stream's
start, :func:`.stream_decider.sweep_at_start`) end only
transactions begun before the driver's call. A driver of an earlier run, paused and
woken after this query's next run took over (a frozen driver the cluster manager
replaced), would otherwise abort the new run's open transactions, those it had just
decided too, and fail its batch; what a sweep is for, the strays of this batch and of
earlier ones, began before. On Kafka 3.8+ the brokers tell by their own clocks (how long
a transaction has run against how long the call has: :class:`.coordinator.CallTime`);
before, a coordinator's start time is compared with the driver's wall clock, and a
driver behind the brokers by more than a batch leaves a stray to a later commit, at
worst to its transaction timeout (a stray of an attempt slot the next batch's task of
that partition happens to take is fenced by that task too).

Before a new decision the driver refuses a batch whose oldest transaction is too close
to ``kafka.transaction.timeout.ms`` (:func:`decision_margin`): it aborts them and fails,
so the coordinator never times out a transaction for being decided late; unset, that
timeout is the broker's ``transaction.max.timeout.ms`` in this mode
(:func:`.checks.with_broker_timeout`). A change stream whose key two tasks' reports share
is refused the same way, before its decision (:mod:`.task_keys`).

A batch write (``df.write`` with ``sinkId``/``txnVersion``) is batch ``txnVersion`` of the
same protocol (:meth:`BatchCommitWriter.plan_job`): a rerun of a version in any shape
writes each record once, and two runs of it at the same time write it once too (each
claims the version and writes under ids of its own; only the newest claim decides:
:mod:`.runs`). Each task takes a new producer: one kept across batches would keep its
epoch, and a late ``EndTxn(commit)`` meant for one batch would commit the next one's
transaction before its decision (docs/protocol.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from confluent_kafka import Producer
from pyspark.sql.datasource import WriterCommitMessage

from eos_connectors.core import faults, timing
from eos_connectors.core.ahead import RowsAhead
from eos_connectors.core.at_once import at_once
from eos_connectors.core.batch_job import TXN_VERSION, BatchJob, JobPlan
from eos_connectors.core.changes import KeyAcrossTasksError
from eos_connectors.core.checkpoint_behind import (
    planned_offsets,
    refuse_at_commit,
    refuse_replanned,
    refuse_replanned_write,
)
from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.continuous import refuse_continuous
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.protocol import Lineage, SinkClaimedError
from eos_connectors.core.spark_api import StreamArrowWriter
from eos_connectors.sinks.kafka import jobs
from eos_connectors.sinks.kafka.claim import check_owner
from eos_connectors.sinks.kafka.clients import (
    CALL_TIMEOUT,
    LIBRDKAFKA_LOG,
    DeliveryFailures,
    abort_quietly,
    call,
    look_up_topic,
    produce_rows,
    retiring,
    wait_delivered,
)
from eos_connectors.sinks.kafka.coordinator import (
    FORGOTTEN,
    CallTime,
    OpenTransaction,
    TransactionClient,
    TransactionEndedError,
    TransactionEndError,
    TransactionFencedError,
    begun_again,
    check_batch_commit,
    kept_client,
)
from eos_connectors.sinks.kafka.decisions import (
    Decision,
    decision_group,
    read_decision,
    read_marker,
    read_pointer,
    write_decision,
)
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.marker import MarkerGroup
from eos_connectors.sinks.kafka.options import (
    KafkaSinkOptions,
    attempt_slot,
    ids_prefix,
    marker_group,
    transactional_id,
)
from eos_connectors.sinks.kafka.pool import MARKER_GROUPS
from eos_connectors.sinks.kafka.runs import RunClaim, claim_run, decide
from eos_connectors.sinks.kafka.stream_decider import deciding
from eos_connectors.sinks.kafka.txn_identity import Identity

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

#: How long a task waits for its producer's statistics to show its open transaction.
IDENTITY_TIMEOUT = 30.0


class PreparedTask(WriterCommitMessage):
    """What one task did: ``txn`` left open for the driver, or nothing to end (its batch
    was marked or decided, or it had no rows)."""

    def __init__(
        self,
        task: TaskIdentity,
        sink_id: str,
        state: str,
        records: int = 0,
        txn: OpenTransaction | None = None,
        opened_at: float = 0.0,
        keys: pa.Array | None = None,
    ) -> None:
        self.batch_id = task.batch_id
        self.partition = task.partition
        self.query_id = task.query_id
        self.query_name = task.query_name
        self.sink_id = sink_id
        self.state = state  # "prepared", "empty", "marked" or "decided"
        self.records = records
        self.txn = txn
        self.opened_at = opened_at  # the task's clock when it began the transaction
        self.keys = keys  # a change stream's distinct keys (:mod:`.task_keys`)


def check_start(options: KafkaSinkOptions) -> None:
    """Driver, once per query start: the driver's transaction client reaches the
    coordinators and may describe the sink's ids (:func:`.coordinator.check_batch_commit`)."""
    sid = options.sink_id or "start-check"
    check_batch_commit(options.kafka, transactional_id(options, sid, 0))


class BatchCommitWriter(StreamArrowWriter):
    """Exactly once without deterministic replay: nothing of a batch is visible before
    the driver decides it, and all of it after (see the module's docstring)."""

    def __init__(self, options: KafkaSinkOptions, checkpoint: str | None = None) -> None:
        self.options = options
        #: The query's checkpointLocation option (driver: an abort no task reported to).
        self.checkpoint_location = checkpoint
        #: A batch job's run: its claim of the version (:mod:`.runs`), made on the driver
        #: by :meth:`plan_job` before Spark ships this writer to the run's tasks and its
        #: commit; None for a stream.
        self.run: RunClaim | None = None

    @property
    def _slot(self) -> int | None:
        """The run's own set of transactional ids (a batch job's), None for a stream's."""
        return self.run.slot if self.run is not None else None

    # -- task ----------------------------------------------------------------------------

    def write(self, iterator: Iterator[pa.RecordBatch]) -> PreparedTask:
        """Task: Spark's entry point; see :meth:`write_task`."""
        return self.write_task(TaskIdentity.current(), iterator)

    def write_task(self, task: TaskIdentity, iterator: Iterator[pa.RecordBatch]) -> PreparedTask:
        """Task: step 1 of the module's docstring. Spark's first rows are pulled on a
        thread meanwhile (:class:`~eos_connectors.core.ahead.RowsAhead`): the checks, the
        new producer and its fencing overlap with Spark computing them."""
        steps = timing.TaskSteps("sink prepare", task.batch_id, rest="produce")
        sid = self.options.sink_id_for(task.query_id)
        attempt = attempt_slot(task.task_attempt_id)
        name = transactional_id(self.options, sid, task.partition, self._slot, attempt)
        pointer_group = decision_group(self.options, sid)
        with (
            RowsAhead(iterator) as ahead,
            MARKER_GROUPS.lent(self.options, marker_group(name)) as marker,
            MARKER_GROUPS.lent(self.options, pointer_group) as pointer,
        ):
            rows_in = steps.pulled("waiting for rows", iter(ahead))
            try:
                # Made before the checks, so that its broker connections come up while
                # they run; it asks for nothing on the id before init_transactions().
                fresh = TaskProducer(self.options, name)
                with retiring(fresh.producer):
                    standing = self._standing(marker, pointer, task, sid)
                    if standing is not None:
                        return PreparedTask(task, sid, standing)
                    return self._prepare(fresh, marker, task, sid, rows_in, steps)
            finally:
                steps.record()

    def _standing(
        self, marker: MarkerGroup, pointer: MarkerGroup, task: TaskIdentity, sid: str
    ) -> str | None:
        """Task: "marked" or "decided" when the batch must not be written, else None. The
        marker and the pointer are read at once: two reads, neither waiting on the other."""
        quick, decided = at_once(
            marker.read_quick, partial(read_pointer, self.options, sid, pointer)
        )
        check_owner(self.options, quick, sid, task.query_id)
        if quick is not None and quick[0] > task.batch_id:
            return "marked"
        if decided is not None and decided[0] > task.batch_id:
            if decided[1] != task.query_id:
                raise SinkClaimedError(sid, Lineage(decided[1]), task.query_id)
            if decided[0] == task.batch_id + 1 and self._to_rewrite(sid, task):
                return None
            log.info(
                "batch %d is decided: task partition %d leaves it to the driver",
                task.batch_id,
                task.partition,
            )
            return "decided"
        return None

    def _to_rewrite(self, sid: str, task: TaskIdentity) -> bool:
        """Task: whether the decision of this (last decided) batch asks this task
        partition to be written again: its decided transaction was aborted."""
        decision = read_decision(self.options, sid, task.batch_id)
        return task.partition in decision.rewrite

    def _prepare(
        self,
        fresh: TaskProducer,
        marker: MarkerGroup,
        task: TaskIdentity,
        sid: str,
        rows_in: Iterator[pa.RecordBatch],
        steps: timing.TaskSteps,
    ) -> PreparedTask:
        """Task: the new producer fenced in (its own id's earlier transaction ended),
        the topic looked up (:func:`~.clients.look_up_topic`), the transaction written and
        flushed, every delivery checked; left open. The producer is then destroyed by a
        thread of the worker (:func:`~.clients.retiring`), which leaves the transaction
        open too. The marker is not read again here: another attempt's open transaction
        (a live attempt of this task partition under another attempt slot) holds an
        offset for the group that a stable read would wait on, and the decision pointer,
        read before, is what says whether the batch may be written."""
        producer = fresh.producer
        call(lambda: producer.init_transactions(CALL_TIMEOUT), "init_transactions")
        look_up_topic(producer, self.options.topic)
        steps.add("checks and fencing", steps.began)  # before any row was waited for
        batches = (b for b in rows_in if b.num_rows)
        first = next(batches, None)
        if first is None:
            return PreparedTask(task, sid, "empty")
        opened_at, joining = time.time(), time.perf_counter()
        call(producer.begin_transaction, "begin_transaction")
        # The marker's offset is the transaction's first part, before any record: see
        # the module's "Re-begun transactions".
        marker.join(producer, task.batch_id + 1, task.query_id, "send_offsets_to_transaction")
        steps.add("marker's offset", joining)
        faults.point("before-prepare", task.batch_id, role="worker", query=task.query_name)
        from eos_connectors.sinks.kafka.records import in_order, rows  # pyarrow: tasks only
        from eos_connectors.sinks.kafka.task_keys import TaskKeys

        changes = self.options.changes
        noted = TaskKeys() if changes.applies_changes else None
        ordered = in_order(_chain(first, batches), changes)
        if noted is not None:
            ordered = noted.passing(ordered)
        try:
            count = produce_rows(producer, rows(ordered, self.options.topic, changes))
        except KafkaSinkError:  # a record refused: its records sent so far stay open else
            abort_quietly(producer)
            raise
        flushing = time.perf_counter()
        fresh.delivered(task)
        txn = fresh.identity.wait(producer, fresh.name, IDENTITY_TIMEOUT)
        steps.add("flush and identity", flushing)
        faults.point("after-prepare", task.batch_id, role="worker", query=task.query_name)
        keys = noted.distinct() if noted is not None else None
        return PreparedTask(task, sid, "prepared", count, txn, opened_at, keys)

    # -- batch jobs (df.write: eos_connectors.core.batch_job) ------------------------------

    def write_as(self, task: TaskIdentity, iterator: Iterator[pa.RecordBatch]) -> PreparedTask:
        """Task: one task of a batch job's run, as batch ``txnVersion`` of the job."""
        return self.write_task(task, iterator)

    def plan_job(self, job: BatchJob) -> JobPlan:
        """Driver, before any task of a batch job's run. A version below the last decided
        one writes nothing; the others claim the version (:mod:`.runs`: the run's own
        transactional ids, and only the newest claim decides). The last decided one runs
        (its tasks find it decided and write nothing, in any shape, and its commit ends
        the decided transactions again); a later one first ends the last decision's
        transactions, so that no task of the new version fences (aborts) a decided
        transaction whose driver died before its commits. Any split of the rows is fine:
        nothing of a version is visible before its decision. With ``streamCheckpoint``, the
        last decided one is refused when its decision recorded other source positions
        than the stream plans for the batch now (a checkpoint put back by one batch)."""
        sid = self.options.sink_id_for(job.query_id)
        pointer = read_pointer(self.options, sid)
        skip = self._skip(job, pointer, sid)
        if skip is None and job.planned and _highest(pointer) == job.version:
            recorded = read_decision(self.options, sid, job.version)
            refuse_replanned_write("eos_kafka", sid, job.version, recorded.offsets, job.planned)
        if skip is None:  # what the job's runs in commitMode=task wrote
            skip = jobs.task_mode_plan(self.options, sid, job)
        if skip is not None:
            return JobPlan(skip=skip, highest=_highest(pointer))
        self.run = claim_run(self.options, sid)
        # Read again under the claim: a decision committed before it is seen now.
        pointer = read_pointer(self.options, sid, stable=True)
        skip = self._skip(job, pointer, sid)
        if skip is not None:
            return JobPlan(skip=skip, highest=_highest(pointer))
        last = _highest(pointer)
        if pointer is not None and job.version > last:
            self._finish_before(read_decision(self.options, sid, last), job, sid)
        return JobPlan(highest=last)

    def _skip(self, job: BatchJob, pointer: tuple[int, str] | None, sid: str) -> str | None:
        """Driver: why a run of ``job`` writes nothing (a later version was decided), else
        None; another owner of the sink id refused."""
        if pointer is None:
            return None
        if pointer[1] != job.query_id:
            raise SinkClaimedError(sid, Lineage(pointer[1]), job.query_id)
        last = pointer[0] - 1
        return f"{TXN_VERSION} {last} was committed before" if job.version < last else None

    def _finish_before(self, decision: Decision, job: BatchJob, sid: str) -> None:
        """Driver: the last decided version's transactions committed (a repeat is
        harmless) before version ``job.version`` runs."""
        if decision.rewrite:
            raise ConfigError(
                f"{TXN_VERSION} {decision.batch} of job {sid!r} was decided, but the "
                f"transactions of its task partitions {list(decision.rewrite)} were aborted "
                f"before their commit. Nothing of {TXN_VERSION} {job.version} was written. "
                f"Rerun {TXN_VERSION} {decision.batch} first with the same input and "
                f"partitioning (it writes those task partitions again), then {job.version}."
            )
        with kept_client(self.options.kafka) as client:
            self._end_decided(client, decision, job.sink_id, sid)

    def end_job(self, job: BatchJob, plan: JobPlan, tasks: int, complete: bool) -> None:
        """Driver: nothing to keep; the decision pointer is the job's record."""

    # -- driver --------------------------------------------------------------------------

    def commit_version(
        self, messages: list[WriterCommitMessage | None], version: int, planned: str = ""
    ) -> None:
        """Driver: a batch job's commit: :meth:`_commit`, which tells it from a stream's by
        the run :meth:`plan_job` claimed; ``planned``: a ``foreachBatch`` stream's source
        positions for the version (``streamCheckpoint``), kept in its decision."""
        self._commit(messages, version, planned)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: a stream's commit (:meth:`_commit`)."""
        self._commit(messages, batchId, "")

    def _commit(
        self, messages: list[WriterCommitMessage | None], batchId: int, job_planned: str
    ) -> None:
        """Driver: steps 2-4 of the module's docstring, once the batch is known not to be
        an epoch of continuous processing (:mod:`eos_connectors.core.continuous`). A
        stream's batch found decided must be its last decided one
        (:mod:`eos_connectors.core.checkpoint_behind`)."""
        offsets = refuse_continuous(messages, batchId, self.checkpoint_location, "eos_kafka")
        reports = [m for m in messages if isinstance(m, PreparedTask)]
        if not reports:
            return
        called = CallTime.now()  # the sweeps end only transactions begun before this call
        name, sid = reports[0].query_name, reports[0].sink_id
        if self.run is None:  # a stream: under this driver's newest claim of the decider
            planned = planned_offsets(offsets)
            decision = deciding(
                self.options, sid, partial(self._decision, reports, batchId, called, planned)
            )
        else:  # a batch job's run: only the newest claim of the version decides
            run = self.run
            decision = self._decision(
                reports,
                batchId,
                called,
                job_planned,
                read_pointer(self.options, sid),
                lambda new: decide(self.options, sid, run, new),
                partial(write_decision, self.options, sid),
            )
        faults.point("after-decision", batchId, role="driver", query=name)
        began = time.perf_counter()
        with kept_client(self.options.kafka) as client:
            self._end_decided(client, decision, name, sid)
            # Best effort: the batch is committed; a broker that cannot be asked now (a
            # coordinator that just died) fails nothing, and the next commit sweeps again.
            keep = list(decision.txns.values())
            stray = client.sweep_if_reachable(ids_prefix(self.options, sid), keep, called)
        if stray is None:
            log.warning(
                "batch %d of sink %s is committed; its sweep of open transactions no "
                "decision names waits for the next batch (a broker did not answer)",
                batchId,
                sid,
            )
        elif stray:
            log.info(
                "batch %d: aborted %d open transactions no decision names", batchId, len(stray)
            )
        timing.record_commit(sid, batchId, len(decision.txns), time.perf_counter() - began)
        faults.point("after-commit", batchId, role="driver", query=name)

    def _decision(
        self,
        reports: list[PreparedTask],
        batch: int,
        called: CallTime,
        planned: str,
        pointed: tuple[int, str] | None,
        write: Callable[[Decision], Decision],
        amend: Callable[[Decision], Decision] | None = None,
    ) -> Decision:
        """Driver: the batch's decision, given the pointer ``pointed``: a decided batch's
        as recorded (amended by ``amend``, else ``write``, when it asked for task
        partitions again and the replay wrote them); else a new one, written by
        ``write``, unless the batch is refused. ``planned``: the source positions' digest
        of a stream's batch, or of a batch job's version with ``streamCheckpoint`` ("" for
        another batch job's)."""
        sid = reports[0].sink_id
        if pointed is not None and pointed[0] > batch:
            if self.run is None:  # a stream's batch is its last decided, unless planned again
                refuse_at_commit("eos_kafka", sid, batch, pointed[0] - 1)
            recorded = read_decision(self.options, sid, batch)
            refuse = refuse_replanned if self.run is None else refuse_replanned_write
            refuse("eos_kafka", sid, batch, recorded.offsets, planned)
            again = _rewritten(recorded, reports)
            return recorded if again is None else (amend or write)(again)
        self._refuse_if_outlived(reports, batch, sid, called)
        self._refuse_keys_across_tasks(reports, batch, sid, called)
        txns = {r.partition: r.txn for r in reports if r.txn is not None}
        records = sum(r.records for r in reports)
        return write(Decision(batch, reports[0].query_id, txns, records, offsets=planned))

    def _amend(self, sid: str, amended: Decision) -> None:
        """Driver: ``amended`` (the same batch, asking for task partitions again) written,
        a stream's under its decider only while the pointer still says that batch is the
        last decided (a later decision means the batch was finished since)."""
        if self.run is not None:
            write_decision(self.options, sid, amended)
            return

        def choose(
            pointed: tuple[int, str] | None, write: Callable[[Decision], Decision]
        ) -> Decision:
            current = pointed is not None and pointed[0] == amended.batch + 1
            return write(amended) if current else amended

        deciding(self.options, sid, choose)

    def _refuse_if_outlived(
        self, reports: list[PreparedTask], batch: int, sid: str, called: CallTime
    ) -> None:
        """Driver, before a decision: a batch whose oldest transaction is too close to
        ``kafka.transaction.timeout.ms`` for the decision and its commits to come first is
        never decided (the coordinator would abort decided transactions): its open
        transactions are aborted and the batch fails, to be written again by the replay."""
        opened = [r.opened_at for r in reports if r.txn is not None and r.opened_at]
        if not opened:
            return
        limit_s = self.options.transaction_timeout_ms / 1000
        age = time.time() - min(opened)
        if age <= limit_s - decision_margin(limit_s):
            return
        self._abort_open(sid, called)
        raise KafkaSinkError(
            f"Batch {batch} of sink {sid}: its oldest transaction has been open {age:.0f} s, "
            f"too close to kafka.transaction.timeout.ms = {self.options.transaction_timeout_ms}"
            f" ({limit_s:.0f} s) for the driver to commit it before the coordinator aborts it."
            " Nothing of the batch was decided or is visible: its transactions were aborted,"
            " and the query's restart writes it again. Make batches shorter "
            "(maxOffsetsPerTrigger on the source), raise kafka.transaction.timeout.ms (at most"
            " the broker's transaction.max.timeout.ms), or use commitMode=task, where each "
            "task commits its own transaction."
        )

    def _refuse_keys_across_tasks(
        self, reports: list[PreparedTask], batch: int, sid: str, called: CallTime
    ) -> None:
        """Driver, before a new decision: a change stream whose key reached two tasks of the
        batch cannot keep that key's order, so the batch is never decided: its open
        transactions are aborted and the batch fails, naming a key, both task partitions
        and the fix (:mod:`.task_keys`)."""
        if not self.options.changes.applies_changes:
            return
        from eos_connectors.sinks.kafka.task_keys import shared_key  # pyarrow: change streams

        found = shared_key([(r.partition, r.keys) for r in reports if r.keys is not None])
        if found is None:
            return
        self._abort_open(sid, called)
        key, low, high = found
        raise KeyAcrossTasksError(f"key={key!r}", sid, batch, (low, high), "'key'")

    def _end_decided(
        self, client: TransactionClient, decision: Decision, name: str | None, sid: str
    ) -> None:
        """Driver: EndTxn(commit) for every decided transaction; one no longer open at its
        epoch (fenced, or aborted by another client) is judged by its marker. Decided
        transactions found aborted are named in an amended decision for the replay to
        write again, and the batch fails."""
        txns = [txn for _, txn in sorted(decision.txns.items())]
        again = client.rebegun(txns)  # see the module's "Re-begun transactions"
        if again:
            client.refusals(again, commit=False)  # what its task wrote after the abort
        refused: dict[OpenTransaction, TransactionEndError] = {t: begun_again(t) for t in again}
        txns = [txn for txn in txns if txn not in refused]
        refused |= client.refusals(txns[:1], commit=True)
        if len(txns) > 1:
            faults.point("between-commits", decision.batch, role="driver", query=name)
            refused |= client.refusals(txns[1:], commit=True)  # all sent, then awaited
        lost: dict[int, TransactionEndedError] = {}
        for partition, txn in sorted(decision.txns.items()):
            refusal = refused.get(txn)
            if refusal is None:
                continue
            if not isinstance(refusal, TransactionEndedError):
                raise refusal
            marked = read_marker(self.options, marker_group(txn.transactional_id))
            if marked is None or marked[0] <= decision.batch:
                lost[partition] = refusal  # else committed before: a repeat
        if lost:
            kept = {p: t for p, t in decision.txns.items() if p not in lost}
            self._amend(sid, replace(decision, txns=kept, rewrite=tuple(sorted(lost))))
            raise _lost(decision, lost)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: an undecided batch's open transactions aborted (every one of the sink's
        ids, those of tasks that never reported too); a decided batch is never touched."""
        reports = [m for m in messages if isinstance(m, PreparedTask)]
        if reports:
            sid: str | None = reports[0].sink_id
        else:
            sid = self.options.unreported_sink_id(self.checkpoint_location)
        if sid is None:
            return
        called = CallTime.now()
        decided = read_pointer(self.options, sid, stable=True)
        if decided is not None and decided[0] > batchId:
            return  # decided: never abort; the replay's commit finishes it
        self._abort_open(sid, called)

    def _abort_open(self, sid: str, called: CallTime) -> None:
        """Driver, for an undecided batch: every open transaction of the sink's ids that
        began before the driver's call ends (a batch job run's own only: another run of
        its version may be going), by fencing its id: a task still writing would begin a
        new transaction at its epoch with its next partition ("Re-begun transactions"),
        which only a later batch's sweep would end, and a batch job has none."""
        timeout_ms = self.options.transaction_timeout_ms
        with kept_client(self.options.kafka) as client:
            client.sweep(ids_prefix(self.options, sid), [], self._slot, called, timeout_ms)


def _highest(pointer: tuple[int, str] | None) -> int:
    """The last version a job's decision pointer names (-1 before any)."""
    return -1 if pointer is None else pointer[0] - 1


def decision_margin(limit_s: float) -> float:
    """Seconds a batch keeps, under its transaction timeout, for the driver's decision and
    commits (and for clocks of the executors and the driver a few seconds apart): a tenth
    of the timeout, at least 10 s."""
    return max(10.0, limit_s / 10)


def _lost(decision: Decision, lost: dict[int, TransactionEndedError]) -> KafkaSinkError:
    partition, refusal = next(iter(sorted(lost.items())))
    txn = decision.txns[partition]
    return KafkaSinkError(
        f"Batch {decision.batch} was decided, but the transaction of task partition "
        f"{partition} ({txn.transactional_id!r}, producer {txn.producer_id}, epoch "
        f"{txn.epoch}; {refusal.code}) was aborted before the driver committed it"
        + (f", and {len(lost) - 1} more" if len(lost) > 1 else "")
        + f": task partitions {sorted(lost)} of the batch are not visible. The batch fails; "
        "its replay writes those task partitions again (from the batch's recorded split) and "
        "commits them. " + _why_lost(refusal)
    )


def _why_lost(refusal: TransactionEndedError) -> str:
    if isinstance(refusal, TransactionFencedError):
        return (
            "If the commit came later than kafka.transaction.timeout.ms after the task "
            "wrote, raise that option."
        )
    if refusal.code == FORGOTTEN:
        return (
            "The coordinator had forgotten its transactional id (transactional.id."
            "expiration.ms): the driver came back that long after the batch was decided."
        )
    return (
        "Another client aborted it at its epoch: make sure no other run of this "
        "query (a driver that was paused or cut off) still writes to this sink id."
    )


def _rewritten(decision: Decision, reports: list[PreparedTask]) -> Decision | None:
    """Driver: the decision of a replayed batch with the task partitions it asked to be
    written again now named by their new transactions (None when it asked none): those
    that wrote nothing this time (no rows) drop out."""
    if not decision.rewrite:
        return None
    missing = sorted(set(decision.rewrite) - {r.partition for r in reports})
    if missing:
        raise KafkaSinkError(
            f"Batch {decision.batch} must write task partitions {missing} again (their "
            "decided transactions were aborted), but this run of it has no such task "
            "partition: replay the batch with the split it was decided with (an eos_kafka "
            "source records it; keep the stages before the sink the same)."
        )
    again = {r.partition: r.txn for r in reports if r.partition in decision.rewrite and r.txn}
    records = decision.records + sum(r.records for r in reports if r.partition in again)
    return replace(decision, txns={**decision.txns, **again}, records=records, rewrite=())


class TaskProducer:
    """Task: a new transactional producer of ``name``, with what watches its deliveries
    and its transaction's identity. librdkafka asks the coordinator for nothing on the id
    until ``init_transactions()`` (the producer id is acquired there, not when the
    client is made), so it can be made before the task's checks."""

    def __init__(self, options: KafkaSinkOptions, name: str) -> None:
        self.name = name
        self.identity, self.failures = Identity(), DeliveryFailures()
        self.producer = Producer(
            {
                **options.producer_config(),
                "transactional.id": name,
                "delivery.report.only.error": True,
                "on_delivery": self.failures,
                "logger": LIBRDKAFKA_LOG,
                **self.identity.settings(),
            }
        )

    def delivered(self, task: TaskIdentity) -> None:
        """Task: every record of the open transaction acknowledged (flushed), or the
        transaction aborted and :class:`KafkaSinkError` naming what was not."""
        try:
            wait_delivered(
                self.producer,
                self.failures,
                f"Task partition {task.partition} of batch {task.batch_id}",
            )
        except KafkaSinkError:
            abort_quietly(self.producer)  # a fenced producer's abort fails: the cause stays
            raise


def _chain(first: pa.RecordBatch, rest: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    yield first
    yield from rest
