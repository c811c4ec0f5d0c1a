"""An in-memory unit store: the protocol's reference implementation, and a test double.

Each hook is a few lines over one :class:`MemoryServer`, a stand-in for a real
store's server: its state outlives any writer (a crash loses the writer, never
the server), and one lock makes each hook atomic the way a database transaction
or a Redis script does. Read it next to a real sink to see what each hook must
guarantee; run :class:`eos_connectors.testing.SinkContract` against it to see the
suite pass.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

from eos_connectors.core.protocol import (
    Decision,
    Lineage,
    Outcome,
    TwoPhaseCommitWriter,
    UnitId,
    UnitMissingError,
    derive_sink_id,
)


@dataclass
class MemoryServer:
    """What a store keeps: staged units, decisions, the record of committed units, data,
    aborted runs."""

    staged: dict[UnitId, list[tuple[str, int]]] = field(default_factory=dict)
    decisions: dict[tuple[str, int], Decision] = field(default_factory=dict)
    committed: set[UnitId] = field(default_factory=set)
    owners: dict[str, Lineage] = field(default_factory=dict)
    data: Counter[str] = field(default_factory=Counter)
    aborted: set[tuple[str, int, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


_SERVERS: dict[str, MemoryServer] = {}


def memory_server(name: str) -> MemoryServer:
    """The server called ``name`` in this process, created on first use."""
    return _SERVERS.setdefault(name, MemoryServer())


class MemorySink(TwoPhaseCommitWriter):
    """Exactly-once into a :class:`MemoryServer`: rows ``(word string, n long)`` add ``n``
    to ``word``'s total when their batch commits. Pickles as its server's name."""

    def __init__(self, server: str, sink_id: str | None = None) -> None:
        self.server_name = server
        self.fixed_sink_id = sink_id

    @property
    def server(self) -> MemoryServer:
        return memory_server(self.server_name)

    def sink_id(self, query_id: str) -> str:
        return self.fixed_sink_id or derive_sink_id("mem", query_id, self.server_name)

    def owner(self, sink_id: str) -> Lineage | None:
        return self.server.owners.get(sink_id)

    def claim(self, sink_id: str, lineage: Lineage) -> Lineage:
        with self.server.lock:
            return self.server.owners.setdefault(sink_id, lineage)

    def find_decision(self, sink_id: str, batch_id: int) -> Decision | None:
        return self.server.decisions.get((sink_id, batch_id))

    def applied_watermark(self, sink_id: str, query_id: str) -> int:
        """The query's highest decided batch (decisions are never pruned here)."""
        decided = [
            b
            for (s, b), d in self.server.decisions.items()
            if s == sink_id and d.query_id == query_id
        ]
        return max(decided, default=-1)

    def prepare(self, unit: UnitId, rows: Iterator[pa.RecordBatch]) -> int:
        staged = [
            (str(word), int(n))
            for batch in rows
            for word, n in zip(
                batch.column("word").to_pylist(), batch.column("n").to_pylist(), strict=True
            )
        ]
        if staged:
            with self.server.lock:
                self.server.staged[unit] = staged
        return len(staged)

    def decide(self, decision: Decision) -> Decision:
        with self.server.lock:
            key = (decision.sink_id, decision.batch_id)
            if key in self.server.decisions:
                return self.server.decisions[key]
            missing = [u for u in decision.units if u not in self.server.staged]
            if missing:
                raise UnitMissingError(decision.batch_id, missing)
            self.server.decisions[key] = decision
            return decision

    def commit_unit(self, unit: UnitId) -> Outcome:
        with self.server.lock:
            rows = self.server.staged.pop(unit, None)
            if rows is None:
                return (
                    Outcome.ALREADY_COMMITTED if unit in self.server.committed else Outcome.MISSING
                )
            for word, n in rows:
                self.apply(word, n)
            self.server.committed.add(unit)  # in the same atomic step as the data
            return Outcome.COMMITTED

    def apply(self, word: str, n: int) -> None:
        """A committed row: ``n`` added to ``word``'s total (under the server's lock)."""
        self.server.data[word] += n

    def rollback_unit(self, unit: UnitId) -> None:
        with self.server.lock:
            self.server.staged.pop(unit, None)

    def rollback_undecided(self, sink_id: str, batch_id: int, units: Sequence[UnitId]) -> bool:
        with self.server.lock:
            if (sink_id, batch_id) in self.server.decisions:
                return False
            for unit in units:
                self.server.staged.pop(unit, None)
            return True

    def units_in_doubt(self, sink_id: str) -> list[UnitId]:
        with self.server.lock:
            return sorted(u for u in self.server.staged if u.sink_id == sink_id)

    def record_abort(self, sink_id: str, batch_id: int, run: str) -> None:
        with self.server.lock:
            self.server.aborted.add((sink_id, batch_id, run))

    def aborted(self, sink_id: str, batch_id: int, run: str) -> bool:
        with self.server.lock:
            return (sink_id, batch_id, run) in self.server.aborted
