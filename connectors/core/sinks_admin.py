"""What ``eos sinks`` shows and does: every sink id found in a store's bookkeeping.

A sink id outlives its query when the checkpoint is deleted or an option that
derives it (``table``, ``keyPrefix``, ``topic``) changes: its units in doubt are
then *orphans* nobody settles. PostgreSQL holds them as prepared transactions
(they hold row locks, hold back VACUUM and use up ``max_prepared_transactions``);
Redis holds their stages in memory. ``list`` finds them, ``settle`` commits what a
decision names and rolls back the rest, ``reset`` forgets a sink id so a new
query can claim it. Each store implements :class:`SinkAdmin` next to its sink.
"""

from __future__ import annotations

import logging
import warnings
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass

from eos_connectors.core.checkpoint_behind import refuse_at_start
from eos_connectors.core.errors import EosError
from eos_connectors.core.protocol import Lineage, TwoPhaseCommitWriter, UnitId
from eos_connectors.core.sink_switch import StartingSink, refuse_a_switch_mid_batch

#: Units in doubt older than this at a query's start are reported as orphans.
ORPHAN_AGE_SECONDS = 300.0
#: A sink that decided a batch more recently than this is taken for a live query's.
QUIET_SECONDS = 300.0


log = logging.getLogger(__name__)


class SinkAdminError(EosError):
    """A sink id that cannot be settled or reset as asked; the message says why."""


@dataclass(frozen=True)
class UnitInDoubt:
    unit: UnitId
    age_seconds: float | None  # None: the store keeps no age


@dataclass(frozen=True)
class SinkRecord:
    """One sink id as a store's bookkeeping knows it."""

    store: str
    sink_id: str
    owner: Lineage | None
    target: str
    last_decided: int | None
    in_doubt: tuple[UnitInDoubt, ...]
    #: Seconds since the sink last decided (or marked) a batch or was claimed; None when
    #: the store keeps no time.
    idle_seconds: float | None = None
    #: The digest of the source positions the last decided batch was decided over
    #: (:func:`~eos_connectors.core.checkpoint_behind.planned_offsets`); "" when the
    #: store keeps none (a decision before digests, a batch job's, a task-mode sink).
    last_offsets: str = ""

    def oldest(self) -> float | None:
        ages = [u.age_seconds for u in self.in_doubt if u.age_seconds is not None]
        return max(ages) if ages else None


@dataclass(frozen=True)
class ResetGuard:
    """What a reset must find before it forgets a sink id, checked atomically with the
    forgetting where the store allows (a live query's next decision waits, or fails).

    ``query_id`` and ``last_committed`` come from the owning query's checkpoint: the sink
    must belong to that query and hold no decision past the batch the checkpoint last
    committed (a restart replays only later batches, which then find nothing to skip).
    Both None: the checkpoint is gone, so no replay can follow. ``quiet_seconds``: the
    sink must have decided nothing for that long (a running query decides every batch).
    """

    query_id: str | None
    last_committed: int | None
    quiet_seconds: float = QUIET_SECONDS

    def problems(self, record: SinkRecord) -> list[str]:
        """Why ``record`` may not be forgotten now ([] when it may)."""
        found = []
        owner = record.owner.query_id if record.owner else None
        if self.query_id is not None and owner not in (None, self.query_id):
            found.append(f"it belongs to query {owner}, not to the checkpoint's ({self.query_id})")
        if record.in_doubt:
            found.append(
                f"{len(record.in_doubt)} unit(s) are in doubt: run `eos sinks settle "
                f"{record.sink_id}` first"
            )
        if (
            self.last_committed is not None
            and record.last_decided is not None
            and record.last_decided > self.last_committed
        ):
            found.append(
                f"it decided batch {record.last_decided}, past batch {self.last_committed}, "
                "the checkpoint's last committed one: the query ran on after that checkpoint "
                "state (give its current checkpoint), or is running now"
            )
        idle = record.idle_seconds
        if idle is not None and idle < self.quiet_seconds:
            found.append(
                f"it decided a batch {idle:.0f} s ago, so its query looks alive: stop it "
                f"(query.stop()) and wait until it has been idle {self.quiet_seconds:.0f} s, "
                "or lower --quiet-seconds if you know it is stopped"
            )
        return found


@dataclass(frozen=True)
class Settled:
    committed: tuple[UnitId, ...]
    rolled_back: tuple[UnitId, ...]


class SinkAdmin(ABC):
    """One store's sink ids: driver-side tooling, never called from a task."""

    store: str

    @abstractmethod
    def records(self) -> list[SinkRecord]:
        """Every sink id with bookkeeping or units in doubt in the store."""

    @abstractmethod
    def writer(self, record: SinkRecord) -> TwoPhaseCommitWriter:
        """A writer over the sink's bookkeeping, to settle it with the protocol's recovery."""

    @abstractmethod
    def forget(self, sink_id: str, guard: ResetGuard) -> None:
        """Delete the sink id's bookkeeping (owner, decisions, commit records), after
        checking ``guard`` again atomically with the deletion where the store allows;
        raise :class:`SinkAdminError` (deleting nothing) when it fails."""

    def close(self) -> None:  # noqa: B027
        """Release connections."""

    def find(self, sink_id: str) -> SinkRecord | None:
        """The sink id's record, or None when the store holds nothing of it. A store may
        look up the one sink id instead of listing all (Kafka, Redis do)."""
        return next((r for r in self.records() if r.sink_id == sink_id), None)

    def record(self, sink_id: str) -> SinkRecord:
        found = self.find(sink_id)
        if found is None:
            raise SinkAdminError(f"No sink {sink_id!r} in {self.store}'s bookkeeping.")
        return found

    def settle(self, sink_id: str) -> Settled:
        """Commit every unit in doubt a decision names, roll back the rest: what the
        sink's own query would do on its next commit. For sink ids whose query is gone:
        an undecided batch of a live query is rolled back (it then fails and replays)."""
        record = self.record(sink_id)
        if not record.in_doubt:
            return Settled((), ())
        writer = self.writer(record)
        try:
            units = [u.unit for u in record.in_doubt]
            named = {u for u in units if _named(writer, u)}
            writer.recover(sink_id, max(u.batch_id for u in units))
            left = set(writer.units_in_doubt(sink_id))
        finally:
            writer.close()
        if left:
            raise SinkAdminError(f"Units still in doubt after settling {sink_id}: {_names(left)}")
        return Settled(tuple(sorted(named)), tuple(sorted(set(units) - named)))

    def reset(self, sink_id: str, guard: ResetGuard) -> None:
        """Forget the sink id, so a new query can claim it; refused (nothing forgotten) when
        ``guard`` finds a reason, checked again by :meth:`forget` as it deletes."""
        refuse(self.store, sink_id, guard.problems(self.record(sink_id)))
        self.forget(sink_id, guard)


def refuse(store: str, sink_id: str, problems: list[str]) -> None:
    """Raise the reset's refusal naming every problem, if there is any."""
    if problems:
        raise SinkAdminError(
            f"Not resetting sink {sink_id!r} in {store}: {'; '.join(problems)}. Nothing was "
            "changed."
        )


def _named(writer: TwoPhaseCommitWriter, unit: UnitId) -> bool:
    decision = writer.find_decision(unit.sink_id, unit.batch_id)
    return decision is not None and unit in decision.units


def _names(units: Iterable[UnitId]) -> str:
    return ", ".join(map(str, sorted(units)))


def orphans(records: Iterable[SinkRecord], target: str, older_than: float) -> list[SinkRecord]:
    """Sink ids on ``target`` (or of unknown target) with units in doubt older than
    ``older_than`` seconds."""
    return [
        r
        for r in records
        if r.target in (target, "") and (r.oldest() or 0.0) >= older_than and r.in_doubt
    ]


def warn_about_orphans(
    admin: SinkAdmin,
    target: str,
    store: str,
    older_than: float,
    starting: StartingSink | None = None,
) -> list[SinkRecord]:
    """Driver, at a query's start: :func:`orphans` on ``target``, logged as a warning
    (and a Python warning); first, with ``starting``, :func:`refuse_a_switch_mid_batch`
    and :func:`~eos_connectors.core.checkpoint_behind.refuse_at_start`. Closes ``admin``."""
    try:
        records = admin.records()
    finally:
        admin.close()
    if starting is not None:
        for record in records:
            owner = record.owner.query_id if record.owner else None
            if owner != starting.query_id or record.last_decided is None:
                continue
            if record.sink_id == starting.sink_id:
                refuse_at_start(
                    starting.connector,
                    record.sink_id,
                    starting.query_id,
                    record.last_decided,
                    starting.checkpoint,
                    starting.planned.last,
                    (record.last_offsets, starting.planned.offsets),
                )
            refuse_a_switch_mid_batch(starting, record.sink_id, record.last_decided, record.target)
    found = orphans(records, target, older_than)
    if found:
        message = orphan_warning(found, store)
        log.warning(message)
        warnings.warn(message, stacklevel=3)
    return found


def orphan_warning(found: list[SinkRecord], store: str) -> str:
    """The warning a query start logs about orphans on its target."""
    listed = "; ".join(
        f"{r.sink_id} ({len(r.in_doubt)} unit(s), oldest {r.oldest() or 0:.0f} s, "
        f"query {r.owner.query_id if r.owner else 'unknown'})"
        for r in found[:5]
    ) + (f"; and {len(found) - 5} more (see `eos sinks list`)" if len(found) > 5 else "")
    return (
        f"{store} holds units in doubt of sink ids no query has settled for minutes: {listed}. "
        "If their queries are gone (checkpoint deleted, options changed), run "
        "`eos sinks settle <sink id>` (and `eos sinks reset <sink id>`); until then they "
        "hold locks and resources."
    )
