"""The two-phase commit protocol every sink here builds on.

A batch's writes become visible only when Spark's micro-batch completes:

* **prepare** (in each task, :meth:`TwoPhaseCommitWriter.write`): write the
  partition's rows durably but invisibly as one *unit*, named by sink, batch,
  partition and attempt;
* **commit** (on the driver, :meth:`TwoPhaseCommitWriter.commit`): record the
  decision "batch N commits these units" in the sink's own store, then commit
  each unit; running it again for the same N commits what the first decision
  named, nothing else;
* **abort** (on the driver): roll back the batch's units unless it was decided;
* **recover** (on the driver, inside every commit): units of earlier batches,
  and units of this batch that the decision does not name, are committed when
  a decision names them and rolled back otherwise.

A sink author implements the store-specific hooks of :class:`UnitStore`; this
module holds the order of the steps and every crash case (see docs/protocol.md).
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from connectors import faults, timing
from connectors.errors import EosError

log = logging.getLogger(__name__)

UNIT_SEPARATOR = "|"
COMMIT_RETRIES = 5


class Outcome(Enum):
    """How committing one unit ended (Flink's committer outcomes)."""

    COMMITTED = "committed"
    ALREADY_COMMITTED = "already committed"
    RETRY = "retry later"
    FAILED = "failed"


class ProtocolError(EosError):
    """The commit protocol cannot go on safely; the message says why and what to do."""


@dataclass(frozen=True, order=True)
class UnitId:
    """One task attempt's prepared writes: ``eos|<sink>|<batch>|<partition>|<attempt>``."""

    sink_id: str
    batch_id: int
    partition: int
    attempt: int

    def __str__(self) -> str:
        parts = ("eos", self.sink_id, self.batch_id, self.partition, self.attempt)
        return UNIT_SEPARATOR.join(str(p) for p in parts)

    @classmethod
    def parse(cls, text: str) -> UnitId | None:
        parts = text.split(UNIT_SEPARATOR)
        if len(parts) != 5 or parts[0] != "eos" or not all(p.isdigit() for p in parts[2:]):
            return None
        return cls(parts[1], int(parts[2]), int(parts[3]), int(parts[4]))

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


@dataclass(frozen=True)
class Decision:
    """The durable record "batch N of sink S commits these units"."""

    sink_id: str
    batch_id: int
    query_id: str
    units: tuple[UnitId, ...]


@dataclass(frozen=True)
class TaskIdentity:
    """Who a task is: from Spark's task context and local properties."""

    query_id: str
    batch_id: int
    partition: int
    attempt: int

    @classmethod
    def current(cls) -> TaskIdentity:
        from pyspark import TaskContext

        context = TaskContext.get()
        batch = context.getLocalProperty("streaming.sql.batchId") if context else None
        query = context.getLocalProperty("sql.streaming.queryId") if context else None
        if context is None or batch is None or query is None:
            raise ProtocolError(
                "This sink runs only inside a Spark Structured Streaming query "
                "(no streaming batch id in the task context)."
            )
        return cls(query, int(batch), context.partitionId(), context.attemptNumber())


class UnitStore(ABC):
    """The store-specific half of a two-phase sink: what a sink author writes."""

    @abstractmethod
    def sink_id(self, query_id: str) -> str:
        """The sink's stable identity: an explicit option, else derived from the query id."""

    @abstractmethod
    def discard_attempts(self, sink_id: str, batch_id: int, partition: int) -> None:
        """Roll back units earlier attempts of this (batch, partition) left prepared."""

    @abstractmethod
    def find_decision(self, sink_id: str, batch_id: int) -> Decision | None:
        """The recorded decision for a batch, if any."""

    @abstractmethod
    def prepare(self, unit: UnitId, rows: Iterator[Any]) -> int:
        """Write ``rows`` durably and invisibly as ``unit``; return the row count."""

    @abstractmethod
    def record_decision(self, decision: Decision) -> Decision:
        """Store ``decision`` unless one exists for the batch; return the stored one."""

    @abstractmethod
    def commit_unit(self, unit: UnitId) -> Outcome:
        """Make ``unit`` visible. Must be idempotent: a committed unit is ALREADY_COMMITTED."""

    @abstractmethod
    def rollback_unit(self, unit: UnitId) -> None:
        """Discard ``unit``; a unit that is gone is fine."""

    @abstractmethod
    def units_in_doubt(self, sink_id: str) -> list[UnitId]:
        """Every prepared, not yet committed or rolled back unit of the sink."""

    def prune_decisions(self, sink_id: str, below_batch: int) -> None:  # noqa: B027
        """Forget decisions of batches Spark can no longer replay (optional)."""

    def applied_watermark(self, sink_id: str, query_id: str) -> int:
        """The highest batch of this query with a committed unit, when the store keeps
        one (optional).

        A task of a batch at or below it writes nothing, even once the batch's
        decision is pruned. Kept per query, so a new checkpoint with the same sink id
        starts from nothing instead of skipping its first batches. -1: none kept.
        """
        return -1


class TwoPhaseCommitWriter(DataSourceStreamArrowWriter, UnitStore):
    """A streaming Arrow writer that runs the protocol over a :class:`UnitStore`."""

    #: Decisions of batches older than this many batches are pruned.
    keep_decisions = 100

    # -- prepare: in every task --------------------------------------------------

    def write(self, iterator: Iterator[Any]) -> PreparedUnit:
        """1. who am I; 2. skip a decided or applied batch; 3. discard earlier attempts;
        4. prepare.

        Step 2 comes before step 3: the units of a decided batch are the driver's to
        commit (a replay after a crash between decision and commit), never to discard.
        """
        task = TaskIdentity.current()
        sink_id = self.sink_id(task.query_id)
        decided = self.find_decision(sink_id, task.batch_id)
        if decided is not None:
            _check_same_query(decided, task.query_id)
        if decided is not None or task.batch_id <= self.applied_watermark(sink_id, task.query_id):
            log.info(
                "batch %d of sink %s is decided already: writing nothing", task.batch_id, sink_id
            )
            return PreparedUnit(
                sink_id, task.query_id, task.batch_id, None, 0, skipped_decided=True
            )
        began = time.perf_counter()
        self.discard_attempts(sink_id, task.batch_id, task.partition)
        unit = UnitId(sink_id, task.batch_id, task.partition, task.attempt)
        rows = self.prepare(unit, iterator)
        timing.record_task("sink write", task.batch_id, time.perf_counter() - began)
        faults.point("after-prepare", task.batch_id, role="worker")
        return PreparedUnit(sink_id, task.query_id, task.batch_id, unit if rows else None, rows)

    # -- commit: on the driver ---------------------------------------------------

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """1. the units; 2. the decision; 3. commit each; 4. recover leftovers; 5. prune."""
        prepared = _prepared_units(messages, batchId)
        sink_id = _sink_of(prepared)
        if sink_id is None:
            return
        began = time.perf_counter()
        decision = self._decide(sink_id, batchId, prepared)
        faults.point("after-decision", batchId, role="driver")
        for index, unit in enumerate(decision.units):
            if index == 1:
                faults.point("between-commits", batchId, role="driver")
            self._commit_with_retries(unit)
        self.recover(sink_id, batchId, decision)
        faults.point("after-commit", batchId, role="driver")
        self.prune_decisions(sink_id, batchId - self.keep_decisions)
        timing.record_commit(sink_id, batchId, len(decision.units), time.perf_counter() - began)

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Roll back the batch's prepared units, unless the batch was decided."""
        prepared = _prepared_units(messages, batchId)
        sink_id = _sink_of(prepared)
        if sink_id is None or self.find_decision(sink_id, batchId) is not None:
            return
        for message in prepared:
            if message.unit is not None:
                self.rollback_unit(message.unit)

    # -- recover -------------------------------------------------------------------

    def recover(self, sink_id: str, batch_id: int, current: Decision | None = None) -> None:
        """Settle every unit left in doubt before ``batch_id``, and ``batch_id``'s strays.

        Units of later batches are left alone: Spark runs batches in order, so they
        can only belong to a query that is running ahead elsewhere.
        """
        decisions: dict[int, Decision | None] = {batch_id: current}
        for unit in sorted(self.units_in_doubt(sink_id)):
            if unit.batch_id > batch_id:
                continue
            if unit.batch_id not in decisions:
                decisions[unit.batch_id] = self.find_decision(sink_id, unit.batch_id)
            decision = decisions[unit.batch_id]
            if decision is not None and unit in decision.units:
                self._commit_with_retries(unit)
            else:
                log.info("rolling back unit %s (no decision names it)", unit)
                self.rollback_unit(unit)

    # -- steps ---------------------------------------------------------------------

    def _decide(self, sink_id: str, batch_id: int, prepared: list[PreparedUnit]) -> Decision:
        """Record this batch's units, or get back what an earlier attempt recorded."""
        units = tuple(sorted(m.unit for m in prepared if m.unit is not None))
        proposal = Decision(sink_id, batch_id, prepared[0].query_id, units)
        recorded = self.record_decision(proposal)
        _check_same_query(recorded, proposal.query_id)
        if recorded.units != units:
            log.info(
                "batch %d was decided by an earlier attempt; committing that decision", batch_id
            )
        return recorded

    def _commit_with_retries(self, unit: UnitId) -> None:
        for attempt in range(COMMIT_RETRIES):
            outcome = self.commit_unit(unit)
            if outcome in (Outcome.COMMITTED, Outcome.ALREADY_COMMITTED):
                return
            if outcome is Outcome.FAILED:
                break
            time.sleep(min(2.0, 0.1 * 2**attempt))
        raise ProtocolError(
            f"Could not commit unit {unit}. The decision is recorded: restart the query "
            "and recovery commits it."
        )


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


def _sink_of(prepared: list[PreparedUnit]) -> str | None:
    sinks = {m.sink_id for m in prepared}
    if len(sinks) > 1:
        raise ProtocolError(f"Commit messages of one batch name several sinks: {sorted(sinks)}")
    return next(iter(sinks), None)
