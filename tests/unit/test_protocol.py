"""The protocol's order of steps and recovery rules, over an in-memory unit store.

The store here is the protocol's test double for its *logic*; every real sink
runs the same protocol against its real server in tests/integration.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from connectors.protocol import (
    Decision,
    Outcome,
    PreparedUnit,
    ProtocolError,
    TaskIdentity,
    TwoPhaseCommitWriter,
    UnitId,
)


class MemoryWriter(TwoPhaseCommitWriter):
    def __init__(self) -> None:
        self.prepared: set[UnitId] = set()
        self.committed: list[UnitId] = []
        self.rolled_back: list[UnitId] = []
        self.decided: dict[int, Decision] = {}
        self.flaky: dict[UnitId, int] = {}

    def sink_id(self, query_id: str) -> str:
        return "s"

    def discard_attempts(self, sink_id: str, batch_id: int, partition: int) -> None:
        for unit in [
            u for u in self.prepared if (u.batch_id, u.partition) == (batch_id, partition)
        ]:
            self.rollback_unit(unit)

    def find_decision(self, sink_id: str, batch_id: int) -> Decision | None:
        return self.decided.get(batch_id)

    def prepare(self, unit: UnitId, rows: Iterator[Any]) -> int:
        count = sum(1 for _ in rows)
        self.prepared.add(unit)
        return count

    def record_decision(self, decision: Decision) -> Decision:
        return self.decided.setdefault(decision.batch_id, decision)

    def commit_unit(self, unit: UnitId) -> Outcome:
        if self.flaky.get(unit, 0):
            self.flaky[unit] -= 1
            return Outcome.RETRY
        if unit in self.committed:
            return Outcome.ALREADY_COMMITTED
        self.prepared.discard(unit)
        self.committed.append(unit)
        return Outcome.COMMITTED

    def rollback_unit(self, unit: UnitId) -> None:
        self.prepared.discard(unit)
        self.rolled_back.append(unit)

    def units_in_doubt(self, sink_id: str) -> list[UnitId]:
        return sorted(self.prepared)


def _unit(batch: int, partition: int, attempt: int = 0) -> UnitId:
    return UnitId("s", batch, partition, attempt)


def _message(unit: UnitId, query: str = "q") -> PreparedUnit:
    return PreparedUnit("s", query, unit.batch_id, unit, 1)


def _in_task(monkeypatch: pytest.MonkeyPatch, batch: int, partition: int, attempt: int) -> None:
    identity = TaskIdentity("q", batch, partition, attempt)
    monkeypatch.setattr(TaskIdentity, "current", classmethod(lambda cls: identity))


def test_unit_names_round_trip_and_prefixes() -> None:
    unit = UnitId("pg-abc", 12, 3, 1)
    assert str(unit) == "eos|pg-abc|12|3|1"
    assert UnitId.parse(str(unit)) == unit
    assert UnitId.parse("someone-elses-gid") is None
    assert str(unit).startswith(UnitId.prefix("pg-abc", 12, 3))
    assert not str(unit).startswith(UnitId.prefix("pg-abc", 1))


def test_commit_records_the_decision_then_commits_each_unit() -> None:
    writer = MemoryWriter()
    units = [_unit(5, 0), _unit(5, 1)]
    writer.prepared.update(units)
    writer.commit([_message(u) for u in units], 5)
    assert writer.decided[5].units == tuple(units)
    assert writer.committed == units
    assert writer.prepared == set()


def test_a_second_commit_of_a_batch_commits_only_the_first_decision() -> None:
    writer = MemoryWriter()
    first, stray = _unit(5, 0), _unit(5, 0, attempt=1)
    writer.record_decision(Decision("s", 5, "q", (first,)))
    writer.prepared.update({first, stray})
    writer.commit([_message(stray)], 5)
    assert writer.committed == [first]
    assert writer.rolled_back == [stray]


def test_recovery_commits_decided_and_rolls_back_undecided_earlier_units() -> None:
    writer = MemoryWriter()
    decided, undecided, later = _unit(3, 0), _unit(4, 1), _unit(9, 0)
    writer.record_decision(Decision("s", 3, "q", (decided,)))
    writer.prepared.update({decided, undecided, later})
    current = _unit(6, 0)
    writer.prepared.add(current)
    writer.commit([_message(current)], 6)
    assert sorted(writer.committed) == [decided, current]
    assert writer.rolled_back == [undecided]
    assert writer.prepared == {later}  # a later batch is not this commit's business


def test_retry_outcomes_are_retried_and_failure_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("connectors.protocol.time.sleep", lambda _s: None)
    writer = MemoryWriter()
    unit = _unit(1, 0)
    writer.prepared.add(unit)
    writer.flaky[unit] = 2
    writer.commit([_message(unit)], 1)
    assert writer.committed == [unit]

    stuck = _unit(2, 0)
    writer.prepared.add(stuck)
    writer.flaky[stuck] = 99
    with pytest.raises(ProtocolError, match="restart the query and recovery commits it"):
        writer.commit([_message(stuck)], 2)
    assert writer.decided[2].units == (stuck,)


def test_abort_rolls_back_unless_decided() -> None:
    writer = MemoryWriter()
    unit = _unit(7, 0)
    writer.prepared.add(unit)
    writer.abort([_message(unit), None], 7)
    assert writer.rolled_back == [unit]

    decided = _unit(8, 0)
    writer.prepared.add(decided)
    writer.record_decision(Decision("s", 8, "q", (decided,)))
    writer.abort([_message(decided)], 8)
    assert decided in writer.prepared


def test_task_discards_earlier_attempts_and_skips_decided_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer = MemoryWriter()
    earlier = _unit(4, 2, attempt=0)
    writer.prepared.add(earlier)
    _in_task(monkeypatch, batch=4, partition=2, attempt=1)
    message = writer.write(iter([1, 2, 3]))
    assert writer.rolled_back == [earlier]
    assert message.unit == _unit(4, 2, attempt=1) and message.rows == 3

    writer.record_decision(Decision("s", 4, "q", (message.unit,)))
    _in_task(monkeypatch, batch=4, partition=2, attempt=2)
    again = writer.write(iter([1, 2, 3]))
    assert again.unit is None and again.skipped_decided
    assert _unit(4, 2, attempt=2) not in writer.prepared
    assert message.unit in writer.prepared, "a decided unit must be left for the driver to commit"


def test_a_batch_at_or_below_the_querys_watermark_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Decisions of old batches are pruned; the watermark still stops a rewrite."""

    class WatermarkWriter(MemoryWriter):
        def applied_watermark(self, sink_id: str, query_id: str) -> int:
            return {"q": 9}.get(query_id, -1)

    writer = WatermarkWriter()
    _in_task(monkeypatch, batch=9, partition=0, attempt=0)
    assert writer.write(iter([1])).skipped_decided
    _in_task(monkeypatch, batch=10, partition=0, attempt=0)
    assert writer.write(iter([1])).unit == _unit(10, 0)


def test_a_decision_by_another_query_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    writer = MemoryWriter()
    writer.record_decision(Decision("s", 0, "old-query", ()))
    _in_task(monkeypatch, batch=0, partition=0, attempt=0)
    with pytest.raises(ProtocolError, match="give this query its own sinkId"):
        writer.write(iter([1]))


def test_commit_messages_must_belong_to_the_batch() -> None:
    writer = MemoryWriter()
    with pytest.raises(ProtocolError, match="Unexpected commit message for batch 3"):
        writer.commit([_message(_unit(2, 0))], 3)
