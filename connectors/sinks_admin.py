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

from connectors.errors import EosError
from connectors.protocol import Lineage, TwoPhaseCommitWriter, UnitId

#: Units in doubt older than this at a query's start are reported as orphans.
ORPHAN_AGE_SECONDS = 300.0


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

    def oldest(self) -> float | None:
        ages = [u.age_seconds for u in self.in_doubt if u.age_seconds is not None]
        return max(ages) if ages else None


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
    def forget(self, sink_id: str) -> None:
        """Delete the sink id's bookkeeping (owner, decisions, commit records)."""

    def close(self) -> None:  # noqa: B027
        """Release connections."""

    def record(self, sink_id: str) -> SinkRecord:
        for record in self.records():
            if record.sink_id == sink_id:
                return record
        raise SinkAdminError(f"No sink {sink_id!r} in {self.store}'s bookkeeping.")

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

    def reset(self, sink_id: str) -> None:
        """Forget the sink id; refused while units are in doubt (settle first)."""
        record = self.record(sink_id)
        if record.in_doubt:
            raise SinkAdminError(
                f"Sink {sink_id!r} has {len(record.in_doubt)} unit(s) in doubt in "
                f"{self.store}: run `eos sinks settle {sink_id}` first."
            )
        self.forget(sink_id)


def _named(writer: TwoPhaseCommitWriter, unit: UnitId) -> bool:
    decision = writer.find_decision(unit.sink_id, unit.batch_id)
    return decision is not None and unit in decision.units


def _names(units: Iterable[UnitId]) -> str:
    return ", ".join(map(str, sorted(units)))


def orphans(records: Iterable[SinkRecord], target: str, older_than: float) -> list[SinkRecord]:
    """Sink ids on ``target`` (or of unknown target) with units in doubt older than
    ``older_than`` seconds."""
    return [
        r for r in records
        if r.target in (target, "") and (r.oldest() or 0.0) >= older_than and r.in_doubt
    ]  # fmt: skip


def warn_about_orphans(
    admin: SinkAdmin, target: str, store: str, older_than: float
) -> list[SinkRecord]:
    """Driver, at a query's start: :func:`orphans` on ``target``, logged as a warning
    (and a Python warning); closes ``admin``."""
    try:
        found = orphans(admin.records(), target, older_than)
    finally:
        admin.close()
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
