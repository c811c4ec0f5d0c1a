"""Deliberately broken stores: the in-memory reference store with one hook wrong each.

A proof that cannot fail proves nothing. Each class below breaks the protocol in one
way a real sink could, and the contract (:class:`SinkContract`) must fail on it;
``tests/unit/test_broken_stores.py`` runs the contract against every one and checks
it does. Read them as the mistakes the kit is there to catch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa

from eos_connectors.core.protocol import Outcome, UnitId
from eos_connectors.testing.memory import MemorySink


class DropsAPartition(MemorySink):
    """Loses rows: task partition 1 reports its rows as prepared and stages none."""

    def prepare(self, unit: UnitId, rows: Iterator[pa.RecordBatch]) -> int:
        count = super().prepare(unit, rows)
        if unit.partition == 1 and count:
            with self.server.lock:
                self.server.staged[unit] = []
        return count


class CommitsTwice(MemorySink):
    """Duplicates: applying a unit keeps its stage and records nothing, so a commit that
    runs again (a replay after a crash between two commits) applies it again."""

    def commit_unit(self, unit: UnitId) -> Outcome:
        with self.server.lock:
            rows = self.server.staged.get(unit)
            if rows is None:
                return Outcome.MISSING
            for word, n in rows:
                self.server.data[word] += n
            return Outcome.COMMITTED

    def units_in_doubt(self, sink_id: str) -> list[UnitId]:
        return []  # it cannot tell an applied unit from one in doubt


class CommitsAtPrepare(MemorySink):
    """Duplicates: rows become visible in the task, before the batch is decided, so a
    batch replayed after a crash writes them again."""

    def prepare(self, unit: UnitId, rows: Iterator[pa.RecordBatch]) -> int:
        count = super().prepare(unit, rows)
        with self.server.lock:
            for word, n in self.server.staged.pop(unit, []):
                self.server.data[word] += n
            self.server.committed.add(unit)
            self.server.staged[unit] = []
        return count


class LeavesUnitsBehind(MemorySink):
    """Leftovers: rolling a unit back forgets it but leaves it staged (a prepared
    transaction nobody settles, holding locks and a slot)."""

    def rollback_unit(self, unit: UnitId) -> None:
        pass

    def rollback_undecided(self, sink_id: str, batch_id: int, units: Sequence[UnitId]) -> bool:
        with self.server.lock:
            return (sink_id, batch_id) not in self.server.decisions


class TakesTheLastWrite(MemorySink):
    """Wrong values: applying a unit sets each word to the unit's last row instead of
    adding it, so a word's total goes back when a later, smaller row comes."""

    def apply(self, word: str, n: int) -> None:
        self.server.data[word] = n


#: Every broken store, by what it breaks.
BROKEN_STORES: dict[str, type[MemorySink]] = {
    "drops a partition": DropsAPartition,
    "commits a replay twice": CommitsTwice,
    "commits before the decision": CommitsAtPrepare,
    "leaves units behind": LeavesUnitsBehind,
    "lets a count go back": TakesTheLastWrite,
}
