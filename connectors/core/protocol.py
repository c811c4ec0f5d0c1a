"""The two-phase commit protocol every exactly-once sink here builds on.

A batch's writes become visible only when Spark's micro-batch completes:

* **prepare** (in each task, :meth:`TwoPhaseCommitWriter.write`): write the
  partition's rows durably but invisibly as one *unit*, named uniquely for this
  task attempt (:class:`UnitId`);
* **commit** (on the driver, :meth:`TwoPhaseCommitWriter.commit`): record the
  decision "batch N commits these units", atomically with checking that each of
  them is prepared, then commit each unit; running it again for the same N
  commits what the first decision named, nothing else;
* **abort** (on the driver): roll back the batch's units unless it was decided;
* **recover** (on the driver, inside every commit): units of earlier batches,
  and units of this batch that the decision does not name, are committed when
  a decision names them and rolled back otherwise.

Rules that make it hold on a cluster, where a task attempt can outlive its
executor (a *zombie*) and attempt numbers repeat across stage attempts:

1. a unit's name holds Spark's task attempt id and the query run's id, so no two
   attempts ever share one;
2. a unit named by a decision is never rolled back: a store rolls back another
   attempt's unit only through :meth:`UnitStore.rollback_undecided`, which checks
   that the batch is undecided atomically with the decision;
3. :meth:`UnitStore.decide` records only units it finds prepared, atomically, and
   "already committed" comes from a record the store writes with the commit: a
   named unit that is neither prepared nor recorded committed is a ProtocolError.

A sink id belongs to one query (its :class:`Lineage`): the driver claims it
atomically before its first decision, and a task or a commit of any other query
fails with :class:`SinkClaimedError` instead of skipping batches the owner wrote
or settling units the owner left.

A sink author implements the store-specific hooks of :class:`UnitStore`; this
module holds the order of the steps and every crash case (see docs/protocol.md).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from pyspark.sql.datasource import WriterCommitMessage

from eos_connectors.core import faults, timing
from eos_connectors.core.ahead import RowsAhead
from eos_connectors.core.checkpoint_behind import (
    planned_offsets,
    refuse_at_commit,
    refuse_replanned,
)
from eos_connectors.core.context import TaskIdentity, query_tag
from eos_connectors.core.continuous import refuse_continuous
from eos_connectors.core.errors import EosError, ServiceUnavailableError
from eos_connectors.core.spark_api import StreamArrowWriter

log = logging.getLogger(__name__)
T = TypeVar("T")

UNIT_SEPARATOR = "|"
#: How long the driver keeps asking the store to commit a decided unit (a connection
#: lost, a store restarting, the driver cut off it): the Kafka sink's calls wait as long.
COMMIT_RETRY_SECONDS = 30.0
# "<task attempt id>-<run>-<query tag>"; a bare attempt number or "<id>-<run>" is a unit
# of an older version of this package, still recognised so recovery settles it.
_ATTEMPT = re.compile(r"^\d+(-[0-9a-z]+){0,2}$")


class Outcome(Enum):
    """How committing one unit ended (Flink's committer outcomes, plus one that is a bug)."""

    COMMITTED = "committed"
    ALREADY_COMMITTED = "already committed"
    RETRY = "retry later"
    FAILED = "failed"
    MISSING = "neither prepared nor recorded as committed"


class ProtocolError(EosError):
    """The commit protocol cannot go on safely; the message says why and what to do."""


class SinkClaimedError(ProtocolError):
    """The sink id belongs to another query (a new checkpoint, or a second query, reuses it)."""

    def __init__(self, sink_id: str, owner: Lineage, query_id: str) -> None:
        self.sink_id = sink_id
        self.owner = owner
        super().__init__(
            f"Sink {sink_id!r} belongs to query {owner.query_id}{owner.describe_origin()}, not to "
            f"this query ({query_id}): a new checkpoint, or a second query, reuses its sink id. "
            "Nothing was written. Give this query its own sinkId option (or leave sinkId unset: "
            "it is then derived from the query id), or, if the other query is gone for good, "
            f"run `eos sinks settle {sink_id}` and `eos sinks reset {sink_id}` first."
        )


class SinkResetError(ProtocolError):
    """The query's sink id was reset (``eos sinks reset``) while the query ran."""

    def __init__(self, sink_id: str, batch_id: int, query_id: str) -> None:
        super().__init__(
            f"Sink {sink_id!r} no longer belongs to query {query_id}: it was reset (eos sinks "
            f"reset) while the query ran. Batch {batch_id} was not decided; restart the query "
            "(it claims the sink id again if no other query did) or give it a new sinkId."
        )


class Siblings(Enum):
    """What a task does with units that other attempts of the same task (its batch and
    partition) left prepared while the batch is undecided.

    On a cluster Spark can run two attempts of one task at once (a stage resubmitted
    after an executor was lost re-runs a partition whose first attempt is still
    going) and keep whichever result reaches its output commit coordinator first.
    A later attempt that rolls back an earlier one's unit can so remove the unit the
    batch's decision names: the commit fails with :class:`UnitMissingError` and the
    query must restart to replay the batch. Stores that can avoid the rollback do.
    """

    #: Roll them back: they may hold locks the task's own writes would wait on (the
    #: default, and the only choice for a store with locks whose units can be torn).
    ROLL_BACK = "roll back"
    #: Report another attempt's unit of this query run as the task's own, writing
    #: nothing: for a store whose prepare is atomic (a PostgreSQL prepared transaction),
    #: so every unit it lists is whole. Units of earlier runs are rolled back.
    ADOPT = "adopt"
    #: Leave them: they block nothing, and the driver's recovery rolls back whatever
    #: the batch's decision does not name (Redis stage lists).
    LEAVE = "leave"


class UnitMissingError(ProtocolError):
    """A unit the driver was about to decide is not prepared (a zombie rolled it back)."""

    def __init__(self, batch_id: int, missing: Sequence[UnitId]) -> None:
        self.missing = tuple(missing)
        super().__init__(
            f"Batch {batch_id}: unit(s) {', '.join(map(str, missing))} are no longer prepared, "
            "so the batch cannot be decided (an attempt that outlived its executor rolled them "
            "back). The batch was rolled back; restart the query and Spark replays it."
        )


class BatchAbortedError(ProtocolError):
    """A task prepared after the driver aborted its batch's run: its unit was rolled back."""

    def __init__(self, unit: UnitId) -> None:
        super().__init__(
            f"Batch {unit.batch_id} of sink {unit.sink_id!r} was aborted by the driver (a "
            "failed batch, or a query stopped mid-batch) before this task prepared: its unit "
            f"{unit} was rolled back and nothing of it is visible. Nothing to do: the next "
            "start replays the batch."
        )


@dataclass(frozen=True, order=True)
class UnitId:
    """One task attempt's prepared writes: ``eos|<sink>|<batch>|<partition>|<attempt>``.

    ``attempt`` is ``<task attempt id>-<run>-<query tag>`` (see :class:`TaskIdentity`):
    unique across task attempts, stage attempts and runs of the query, and naming the
    query that made it. At most 64 + 73 characters, within PostgreSQL's 200-byte gids.
    """

    sink_id: str
    batch_id: int
    partition: int
    attempt: str

    def __str__(self) -> str:
        parts = ("eos", self.sink_id, self.batch_id, self.partition, self.attempt)
        return UNIT_SEPARATOR.join(str(p) for p in parts)

    @classmethod
    def parse(cls, text: str) -> UnitId | None:
        parts = text.split(UNIT_SEPARATOR)
        if len(parts) != 5 or parts[0] != "eos" or not (parts[2] + parts[3]).isdigit():
            return None
        if not _ATTEMPT.match(parts[4]):
            return None
        return cls(parts[1], int(parts[2]), int(parts[3]), parts[4])

    @property
    def run(self) -> str:
        """The 12 hex digits of the query run that made the unit ("" for an older unit)."""
        parts = self.attempt.split("-")
        return parts[1] if len(parts) > 1 else ""

    def same_run(self, task: TaskIdentity) -> bool:
        """Whether another attempt of ``task``'s run made this unit (the attempt's id aside)."""
        return self.attempt.partition("-")[2] == task.attempt.partition("-")[2]

    def made_by(self, query_id: str) -> bool:
        """Whether the query ``query_id`` made this unit (True for an untagged older unit)."""
        parts = self.attempt.split("-")
        return len(parts) < 3 or parts[2] == query_tag(query_id)

    @staticmethod
    def prefix(sink_id: str, batch_id: int | None = None, partition: int | None = None) -> str:
        """The common start of every unit name of a sink (, batch (, partition))."""
        parts: list[object] = ["eos", sink_id]
        parts += [p for p in (batch_id, partition) if p is not None]
        return UNIT_SEPARATOR.join(str(p) for p in parts) + UNIT_SEPARATOR


@dataclass(frozen=True)
class PreparedUnit(WriterCommitMessage):
    """A task's commit message: the unit it prepared, or None when it wrote nothing."""

    sink_id: str
    query_id: str
    batch_id: int
    unit: UnitId | None
    rows: int
    skipped_decided: bool = False
    query_name: str | None = None
    #: The run that made it (12 hex digits, as in unit names): tells the driver's abort
    #: which run to record as aborted even when the task wrote nothing.
    run: str = ""

    @property
    def skipped(self) -> bool:
        """Whether the task wrote nothing because its batch was decided or applied."""
        return self.skipped_decided


@dataclass(frozen=True)
class Decision:
    """The durable record "batch N of sink S commits these units"."""

    sink_id: str
    batch_id: int
    query_id: str
    units: tuple[UnitId, ...]
    #: A stream's batch: a digest of the source positions its ``offsets/N`` planned
    #: (:func:`~eos_connectors.core.checkpoint_behind.planned_offsets`), which the commit
    #: of a replay compares. "" when unknown: a batch job's version, a checkpoint the
    #: driver cannot read, a decision written before digests were kept, a store that does
    #: not keep it (every store may ignore it, losing only that check).
    offsets: str = ""


@dataclass(frozen=True)
class Lineage:
    """Which query owns a sink id: its query id, and the lineage it was restored from
    (empty until savepoints restore one query's state into another)."""

    query_id: str
    origin: str = ""

    def describe_origin(self) -> str:
        return f" (restored from {self.origin})" if self.origin else ""


def derive_sink_id(kind: str, query_id: str, *target: str) -> str:
    """A sink id stable across restarts of one checkpoint: ``<kind>-<16 hex digits>`` of
    the query id and what the sink writes to (table, key prefix, topic)."""
    digest = hashlib.sha256(UNIT_SEPARATOR.join((query_id, *target)).encode()).hexdigest()
    return f"{kind}-{digest[:16]}"


class UnitStore(ABC):
    """The store-specific half of a two-phase sink: what a sink author writes.

    Every hook runs on the driver except :meth:`prepare` and those
    :meth:`TwoPhaseCommitWriter.prepare_task` calls, which run in tasks too.
    """

    #: What a task does with the units other attempts of it left (see :class:`Siblings`).
    siblings: Siblings = Siblings.ROLL_BACK

    @abstractmethod
    def sink_id(self, query_id: str) -> str:
        """Driver and task: the sink's stable identity, an explicit option, else
        :func:`derive_sink_id`."""

    @abstractmethod
    def owner(self, sink_id: str) -> Lineage | None:
        """Driver and task: the query that claimed the sink id, or None before any claim."""

    @abstractmethod
    def claim(self, sink_id: str, lineage: Lineage) -> Lineage:
        """Driver, atomically: record ``lineage`` as the sink's owner unless one is recorded;
        return the owner (``lineage`` itself, or the other query's)."""

    @abstractmethod
    def find_decision(self, sink_id: str, batch_id: int) -> Decision | None:
        """Driver and task: the recorded decision for a batch, if any."""

    @abstractmethod
    def prepare(self, unit: UnitId, rows: Iterator[Any]) -> int:
        """Task: write ``rows`` durably and invisibly as ``unit``; return the row count.

        Writing nothing (0 rows) must leave nothing prepared."""

    @abstractmethod
    def decide(self, decision: Decision) -> Decision:
        """Driver, atomically: if the batch has a decision, return it; else check that every
        unit of ``decision`` is prepared (raise :class:`UnitMissingError` naming those
        that are not), store it and return it."""

    @abstractmethod
    def commit_unit(self, unit: UnitId) -> Outcome:
        """Driver: make ``unit`` visible, recording durably (in the same atomic step) that it was.

        Idempotent: a unit recorded as committed is ALREADY_COMMITTED; a unit neither
        prepared nor recorded is MISSING (never ALREADY_COMMITTED)."""

    @abstractmethod
    def rollback_unit(self, unit: UnitId) -> None:
        """Driver and task: discard ``unit``; a unit that is gone is fine. Called only for
        a unit that no decision names while its batch's decision exists (a stray)."""

    @abstractmethod
    def rollback_undecided(self, sink_id: str, batch_id: int, units: Sequence[UnitId]) -> bool:
        """Driver and task, atomically with :meth:`decide`: unless batch ``batch_id`` is
        decided, discard ``units`` and return True; return False (and discard nothing)
        when it is."""

    @abstractmethod
    def units_in_doubt(self, sink_id: str) -> list[UnitId]:
        """Driver and task: every prepared, not yet committed or rolled back unit of the sink."""

    def prune_decisions(self, sink_id: str, below_batch: int) -> None:  # noqa: B027
        """Driver: forget decisions (and commit records) of batches Spark can no longer replay."""

    def record_abort(self, sink_id: str, batch_id: int, run: str) -> None:  # noqa: B027
        """Driver, on abort, before it looks for the batch's units: record durably that run
        ``run`` of batch ``batch_id`` was aborted (optional). With it, a task of that run
        still going after the abort rolls back what it prepares (:meth:`aborted`); without
        it, such a unit stays in doubt until the next start's recovery or ``eos sinks
        settle``. Pruned with the decisions."""

    def aborted(self, sink_id: str, batch_id: int, run: str) -> bool:
        """Task, after its prepare: whether :meth:`record_abort` recorded run ``run`` of
        batch ``batch_id`` (optional; False when the store records no aborts)."""
        return False

    def forget_key_claims(self, sink_id: str, up_to_batch: int) -> None:  # noqa: B027
        """Driver, once a batch is committed or aborted: drop what its tasks claimed to keep
        one key in one task (optional; the PostgreSQL and Redis sinks claim keys)."""

    def close(self) -> None:  # noqa: B027
        """Release the writer's connections (optional; the test kit calls it for a crash)."""

    def applied_watermark(self, sink_id: str, query_id: str) -> int:
        """The highest batch of this query that writes nothing more, when the store keeps
        one (optional): one meaning for every store, "at or below it, a batch's tasks and
        a batch job's driver write nothing". A store may keep the highest batch it
        decided (PostgreSQL) or the highest it applied (Redis): the two differ only for
        a batch decided and not yet applied, and every caller asks for the batch's
        decision first (a task skips it; a batch job's driver runs its commit, which
        applies it).

        Kept per query, so a new checkpoint with the same sink id starts from nothing
        instead of skipping its first batches; it outlives pruned decisions, so a batch
        job's ``txnVersion`` used again long after still writes nothing. -1: none kept.
        """
        return -1


class TwoPhaseCommitWriter(StreamArrowWriter, UnitStore):
    """A streaming Arrow writer that runs the protocol over a :class:`UnitStore`."""

    #: Decisions of batches older than this many batches are pruned.
    keep_decisions = 100
    #: The query's ``checkpointLocation`` option, when the format hands it to the writer
    #: (driver only: :meth:`unreported_sink`, :func:`refuse_continuous`).
    checkpoint_location: str | None = None
    #: The sink's format name, for messages.
    connector = "this sink"

    # -- prepare: in every task --------------------------------------------------

    def write(self, iterator: Iterator[Any]) -> PreparedUnit:
        """Task: Spark's entry point; see :meth:`prepare_task`."""
        return self.prepare_task(TaskIdentity.current(), iterator)

    def write_as(self, task: TaskIdentity, iterator: Iterator[Any]) -> PreparedUnit:
        """Task: a batch job's entry point (:mod:`eos_connectors.core.batch_job`)."""
        return self.prepare_task(task, iterator)

    def prepare_task(self, task: TaskIdentity, rows: Iterator[Any]) -> PreparedUnit:
        """Task: 1. skip a decided or applied batch; 2. release what strays of earlier
        batches hold, and deal with what other attempts of this task left (roll back,
        adopt or leave, as :attr:`siblings` says); 3. prepare; 4. report the unit.

        Step 1 comes before step 2: the units of a decided batch are the driver's to
        commit (a replay after a crash between decision and commit), never to discard.
        Step 2 discards only while the batch is undecided, atomically (rule 2). Before
        both, a sink id another query owns fails the task (:class:`SinkClaimedError`).
        Spark's first rows are pulled on a thread during 1-2 (:class:`RowsAhead`).
        """
        with RowsAhead(rows) as ahead:
            return self._prepare(task, iter(ahead))

    def _prepare(self, task: TaskIdentity, rows: Iterator[Any]) -> PreparedUnit:
        steps = timing.TaskSteps("sink write", task.batch_id, rest="write and prepare")
        sink_id = self.sink_id(task.query_id)
        self.check_owner(sink_id, task.query_id)
        released = not self._already_done(sink_id, task) and self._release_others(sink_id, task)
        if released is False:
            log.info("batch %d of sink %s is decided: writing nothing", task.batch_id, sink_id)
            return _report(task, sink_id, None, 0, skipped_decided=True)
        if isinstance(released, UnitId):
            log.info("reporting %s, prepared whole by another attempt of this task", released)
            return _report(task, sink_id, released, 0)
        steps.add("owner and batch checks", steps.began)
        faults.point("before-prepare", task.batch_id, role="worker", query=task.query_name)
        unit = UnitId(sink_id, task.batch_id, task.partition, task.attempt)
        pulled = steps.pulled("waiting for rows", rows)
        count = self.prepare(unit, _mid_prepare_point(pulled, task))
        if count:
            self._unless_aborted(unit)
        steps.record()
        faults.point("after-prepare", task.batch_id, role="worker", query=task.query_name)
        return _report(task, sink_id, unit if count else None, count)

    def _unless_aborted(self, unit: UnitId) -> None:
        """Task, after the prepare: a unit of a run whose batch the driver aborted meanwhile
        is rolled back here, and the task fails (:class:`BatchAbortedError`).

        The driver records the abort, then looks for the batch's units; the task
        prepares, then looks for the record. Whichever comes second sees the other's
        write, so a unit prepared after the abort is rolled back by one of them (or
        both: a rollback of a unit gone is fine), and none is left in doubt."""
        if self.aborted(unit.sink_id, unit.batch_id, unit.run):
            self.rollback_undecided(unit.sink_id, unit.batch_id, [unit])
            raise BatchAbortedError(unit)

    def check_owner(self, sink_id: str, query_id: str) -> None:
        """Task or driver: SinkClaimedError when another query owns the sink id."""
        owner = self.owner(sink_id)
        if owner is not None and owner.query_id != query_id:
            raise SinkClaimedError(sink_id, owner, query_id)

    def _already_done(self, sink_id: str, task: TaskIdentity) -> bool:
        decided = self.find_decision(sink_id, task.batch_id)
        if decided is not None:
            _check_same_query(decided, task.query_id)
            return True
        return task.batch_id <= self.applied_watermark(sink_id, task.query_id)

    def _release_others(self, sink_id: str, task: TaskIdentity) -> bool | UnitId:
        """Roll back strays of earlier batches (they may hold locks this task's writes would
        wait on), then deal with the units earlier attempts of this (batch, partition) left:
        True to go on and prepare, False when the batch got decided meanwhile, or another
        attempt's whole unit to report (:class:`Siblings`). Only this query's units: until
        a query claims the sink id, another query's may be the ones its first decision
        names."""
        units = self.units_in_doubt(sink_id)
        by_batch = _by_batch(u for u in units if u.made_by(task.query_id))
        for batch_id in sorted(b for b in by_batch if b < task.batch_id):
            self._settle_undecided_or_stray(sink_id, batch_id, by_batch[batch_id], commit=False)
        mine = [u for u in by_batch.get(task.batch_id, []) if u.partition == task.partition]
        if not mine or self.siblings is Siblings.LEAVE:
            return True
        whole = [u for u in mine if u.same_run(task)]
        if self.siblings is Siblings.ADOPT and whole:
            return whole[0]
        log.info("rolling back %s left by earlier attempts", ", ".join(map(str, mine)))
        return self.rollback_undecided(sink_id, task.batch_id, mine)

    # -- commit: on the driver ---------------------------------------------------

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: Spark's entry point for a stream's batch: :meth:`commit_version`, once a
        batch whose tasks found it decided or applied is known to be the query's last
        decided one, not a number a checkpoint behind the sink planned again
        (:mod:`eos_connectors.core.checkpoint_behind`)."""
        self._commit(messages, batchId, stream=True)

    def commit_version(
        self, messages: Sequence[WriterCommitMessage | None], version: int, planned: str = ""
    ) -> None:
        """Driver: a batch job's entry point (:mod:`eos_connectors.core.batch_job`): a
        version at or below a decided one is a rerun, whose tasks write nothing.
        ``planned``: a ``foreachBatch`` stream's source positions for the version, kept in
        its decision (``streamCheckpoint``; "" without)."""
        self._commit(messages, version, stream=False, job_planned=planned)

    def _commit(
        self,
        messages: Sequence[WriterCommitMessage | None],
        batchId: int,
        stream: bool,
        job_planned: str = "",
    ) -> None:
        """Driver: 1. the units; 2. claim the sink id; 3. decide; 4. settle earlier batches;
        5. commit each unit; 6. roll back this batch's strays; 7. prune.

        Step 4 comes before step 5: a batch decided but not yet applied (a driver that
        died between decision and commit, then a batch job run with the next version)
        must land before this batch's units, never over them. An epoch of continuous
        processing is refused first (:mod:`eos_connectors.core.continuous`)."""
        offsets = refuse_continuous(messages, batchId, self.checkpoint_location, self.connector)
        prepared = _prepared_units(messages, batchId)
        sink_id = _sink_of(prepared)
        if sink_id is None:
            return
        planned = planned_offsets(offsets) if stream else job_planned
        if stream and any(m.skipped for m in prepared):
            self._refuse_a_checkpoint_behind(sink_id, batchId, prepared[0].query_id, planned)
        query = prepared[0].query_name
        began = time.perf_counter()
        patience = Patience()
        patience.reaching(lambda: self._claim(sink_id, prepared))
        decision = patience.reaching(lambda: self._decide(sink_id, batchId, prepared, planned))
        faults.point("after-decision", batchId, role="driver", query=query)
        self.recover(sink_id, batchId - 1)
        for index, unit in enumerate(decision.units):
            if index == 1:
                faults.point("between-commits", batchId, role="driver", query=query)
            self._commit_with_retries(unit, patience)
        self.recover(sink_id, batchId, decision)
        faults.point("after-commit", batchId, role="driver", query=query)
        self.prune_decisions(sink_id, batchId - self.keep_decisions)
        self.forget_key_claims(sink_id, batchId)
        timing.record_commit(sink_id, batchId, len(decision.units), time.perf_counter() - began)

    def _refuse_a_checkpoint_behind(
        self, sink_id: str, batch_id: int, query_id: str, planned: str
    ) -> None:
        """Driver, at a stream's commit of a batch its tasks found decided or applied: it
        must be the query's last decided batch, over the source positions its decision
        recorded (:mod:`eos_connectors.core.checkpoint_behind`)."""
        later = self.applied_watermark(sink_id, query_id)
        refuse_at_commit(self.connector, sink_id, batch_id, later)
        recorded = self.find_decision(sink_id, batch_id)
        if recorded is not None:
            refuse_replanned(self.connector, sink_id, batch_id, recorded.offsets, planned)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: roll back the batch's units, unless the batch was decided: those its
        finished tasks reported, and, found by their names in the store, those of tasks
        Spark stopped waiting for (a cancelled batch, ``query.stop()``: Spark hands
        ``abort`` only the finished tasks' messages), so they hold no lock until the
        next start. The abort of the run is recorded first, so a task of it that prepares
        later rolls its unit back itself (:meth:`_unless_aborted`)."""
        prepared = _prepared_units(messages, batchId)
        sink_id = _sink_of(prepared) or self.unreported_sink()
        if sink_id is None:
            return
        for run in sorted({m.run for m in prepared if m.run}):  # first: see _unless_aborted
            self.record_abort(sink_id, batchId, run)
        reported = {m.unit for m in prepared if m.unit is not None}
        unreported = {u for u in self.units_in_doubt(sink_id) if u.batch_id == batchId}
        if reported or unreported:
            self.rollback_undecided(sink_id, batchId, sorted(reported | unreported))
        self.forget_key_claims(sink_id, batchId)

    def unreported_sink(self) -> str | None:
        """Driver, in an abort no task reported to (a query stopped before any task of its
        batch finished): the sink id, from the query id in the checkpoint's metadata
        (:attr:`checkpoint_location`); None when it cannot be told, and the next start's
        recovery settles what the batch's tasks prepared."""
        from eos_connectors.core.checkpoint_sinks import sink_of_checkpoint

        return sink_of_checkpoint(self.checkpoint_location, self.sink_id)

    # -- recover -------------------------------------------------------------------

    def recover(self, sink_id: str, batch_id: int, current: Decision | None = None) -> None:
        """Driver: settle every unit left in doubt before ``batch_id``, and ``batch_id``'s
        strays.

        Units of later batches are left alone: Spark runs batches in order, so they
        can only belong to an attempt of a batch still to be decided.
        """
        by_batch = _by_batch(self.units_in_doubt(sink_id))
        for unit_batch in sorted(b for b in by_batch if b <= batch_id):
            decision = current if unit_batch == batch_id else None
            self._settle_undecided_or_stray(
                sink_id, unit_batch, by_batch[unit_batch], commit=True, decision=decision
            )

    def _settle_undecided_or_stray(
        self,
        sink_id: str,
        batch_id: int,
        units: list[UnitId],
        commit: bool,
        decision: Decision | None = None,
    ) -> None:
        """Units a decision names are committed (when ``commit``), the others rolled back:
        strays of a decided batch directly, units of an undecided one only while it is."""
        decision = decision or self.find_decision(sink_id, batch_id)
        if decision is None:
            log.info("rolling back %s (batch %d is undecided)", _names(units), batch_id)
            self.rollback_undecided(sink_id, batch_id, units)
            return
        for unit in units:
            if unit not in decision.units:
                log.info("rolling back stray unit %s (its batch's decision does not name it)", unit)
                self.rollback_unit(unit)
            elif commit:
                self._commit_with_retries(unit)

    # -- steps ---------------------------------------------------------------------

    def _claim(self, sink_id: str, prepared: list[PreparedUnit]) -> None:
        """Own the sink id, or roll back this batch's units (no decision of the owner can
        name them) and fail."""
        query_id = prepared[0].query_id
        owner = self.claim(sink_id, Lineage(query_id))
        if owner.query_id != query_id:
            for message in prepared:
                if message.unit is not None:
                    self.rollback_unit(message.unit)
            raise SinkClaimedError(sink_id, owner, query_id)

    def _decide(
        self, sink_id: str, batch_id: int, prepared: list[PreparedUnit], planned: str
    ) -> Decision:
        """Record this batch's units (and ``planned``, its source positions' digest), or get
        back what an earlier attempt recorded. A unit that vanished before the decision
        rolls the batch back and fails it (rule 3)."""
        units = tuple(sorted(m.unit for m in prepared if m.unit is not None))
        proposal = Decision(sink_id, batch_id, prepared[0].query_id, units, planned)
        try:
            recorded = self.decide(proposal)
        except UnitMissingError as exc:
            self.rollback_undecided(sink_id, batch_id, [u for u in units if u not in exc.missing])
            raise
        _check_same_query(recorded, proposal.query_id)
        if recorded.units != units:
            log.info(
                "batch %d was decided by an earlier attempt; committing that decision", batch_id
            )
        return recorded

    def _commit_with_retries(self, unit: UnitId, patience: Patience | None = None) -> None:
        """Driver: commit ``unit`` (decided: committing it again is harmless), asking again
        while the batch's :class:`Patience` (or a new one) lasts."""
        patience = patience or Patience()
        while True:
            try:
                outcome = self.commit_unit(unit)
            except ServiceUnavailableError as exc:  # not reached: nothing ran
                log.warning("committing %s: %s; asking again", unit, exc)
                outcome = Outcome.RETRY
            if outcome in (Outcome.COMMITTED, Outcome.ALREADY_COMMITTED):
                return
            if outcome is Outcome.MISSING:
                raise ProtocolError(
                    f"Unit {unit} is named by its batch's decision but is neither prepared nor "
                    "recorded as committed: its writes are lost. Something outside this "
                    "protocol rolled it back (a manual ROLLBACK PREPARED, a FLUSHALL, another "
                    "query with the same sinkId). Restore the target from its source."
                )
            if outcome is Outcome.FAILED or not patience.wait():
                break
        raise ProtocolError(
            f"Could not commit unit {unit}. The decision is recorded: restart the query "
            "and recovery commits it."
        )


class Patience:
    """Driver: one batch commit's patience with a store it cannot reach (a connection
    lost, the store restarting, the driver cut off it), ``COMMIT_RETRY_SECONDS`` from its
    first failure, with pauses growing to 2 s. Claiming and deciding are asked again only
    when the store was not reached at all (:class:`ServiceUnavailableError` from a hook:
    nothing ran); committing a decided unit then too, and whenever the store says
    :attr:`Outcome.RETRY`."""

    def __init__(self) -> None:
        self.deadline: float | None = None
        self.waited = 0.0  # the pauses alone: a test's clock may stand still
        self.attempt = 0

    def wait(self) -> bool:
        """Pause before the next try; False, without pausing, once the patience is spent."""
        now = time.monotonic()
        if self.deadline is None:
            self.deadline = now + COMMIT_RETRY_SECONDS
        if now >= self.deadline or self.waited >= COMMIT_RETRY_SECONDS:
            return False
        pause = min(2.0, 0.1 * 2**self.attempt)
        time.sleep(pause)
        self.waited += pause
        self.attempt += 1
        return True

    def reaching(self, call: Callable[[], T]) -> T:
        """``call()``, asked again while the store cannot be reached and patience lasts."""
        while True:
            try:
                return call()
            except ServiceUnavailableError as exc:
                if not self.wait():
                    raise
                log.warning("%s; asking again", exc)


def _mid_prepare_point(rows: Iterator[Any], task: TaskIdentity) -> Iterator[Any]:
    """``rows`` as they are, with the ``mid-prepare`` fault point once the store has taken
    the first Arrow batch and asks for the next: a crash while the unit is half written."""
    for index, batch in enumerate(rows):
        yield batch
        if index == 0:
            faults.point("mid-prepare", task.batch_id, role="worker", query=task.query_name)


def _by_batch(units: Iterable[UnitId]) -> dict[int, list[UnitId]]:
    grouped: dict[int, list[UnitId]] = {}
    for unit in sorted(units):
        grouped.setdefault(unit.batch_id, []).append(unit)
    return grouped


def _names(units: Iterable[UnitId]) -> str:
    return ", ".join(map(str, units))


def _check_same_query(decision: Decision, query_id: str) -> None:
    if decision.query_id != query_id:
        raise ProtocolError(
            f"Batch {decision.batch_id} of sink {decision.sink_id!r} was decided by query "
            f"{decision.query_id}, not by this query ({query_id}). The sink id is reused by "
            "another query or a new checkpoint: give this query its own sinkId option."
        )


def _prepared_units(
    messages: Sequence[WriterCommitMessage | None], batch_id: int
) -> list[PreparedUnit]:
    prepared = []
    for message in messages:
        if message is None:
            continue
        if not isinstance(message, PreparedUnit) or message.batch_id != batch_id:
            raise ProtocolError(f"Unexpected commit message for batch {batch_id}: {message!r}")
        prepared.append(message)
    return prepared


def _report(
    task: TaskIdentity,
    sink_id: str,
    unit: UnitId | None,
    rows: int,
    skipped_decided: bool = False,
) -> PreparedUnit:
    """Task: the commit message of ``task``'s attempt."""
    return PreparedUnit(
        sink_id,
        task.query_id,
        task.batch_id,
        unit,
        rows,
        skipped_decided,
        task.query_name,
        task.run,
    )


def _sink_of(prepared: list[PreparedUnit]) -> str | None:
    sinks = {m.sink_id for m in prepared}
    if len(sinks) > 1:
        raise ProtocolError(f"Commit messages of one batch name several sinks: {sorted(sinks)}")
    return next(iter(sinks), None)
