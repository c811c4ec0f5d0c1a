"""The protocol's rules that the contract suite does not pin, over the in-memory store.

The contract suite (eos_connectors.testing, run against every store in
tests/unit/test_memory_contract.py and tests/services/test_contract.py) covers
crashes at every step and the cluster interleavings; this file covers naming,
retries, the watermark skip and refusals.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from eos_connectors.core.context import TaskIdentity, query_tag
from eos_connectors.core.errors import ServiceUnavailableError
from eos_connectors.core.protocol import (
    COMMIT_RETRY_SECONDS,
    Decision,
    Outcome,
    PreparedUnit,
    ProtocolError,
    UnitId,
    derive_sink_id,
)
from eos_connectors.testing import MemorySink, memory_server, rows_of


def _writer() -> MemorySink:
    return MemorySink(f"unit-{uuid.uuid4().hex}", sink_id="s")


def _task(batch: int, partition: int = 0, task_id: int = 1, query: str = "q") -> TaskIdentity:
    return TaskIdentity(
        query, "name", "4f1c0e2a-9b7d-4c55-8e1f-0a2b3c4d5e6f", batch, partition, task_id
    )


def _rows() -> list[object]:
    return [rows_of([("a", 1), ("b", 2)])]


def test_unit_names_are_unique_per_attempt_and_round_trip() -> None:
    task = _task(12, 3, task_id=881)
    unit = UnitId("pg-abc", 12, 3, task.attempt)
    assert str(unit) == f"eos|pg-abc|12|3|881-4f1c0e2a9b7d-{query_tag('q')}"
    assert unit.made_by("q") and not unit.made_by("another query")
    assert UnitId.parse(str(unit)) == unit
    assert UnitId.parse("someone-elses-gid") is None
    assert UnitId.parse("eos|s|1|2|not an attempt") is None
    untagged = UnitId.parse("eos|pg-abc|12|3|1-4f1c0e2a9b7d")
    assert untagged is not None and untagged.made_by("any"), "untagged: anyone's"
    assert UnitId.parse("eos|pg-abc|12|3|1") == UnitId("pg-abc", 12, 3, "1"), (
        "units named by an older version must still be recognised, so recovery settles them"
    )
    assert str(unit).startswith(UnitId.prefix("pg-abc", 12, 3))
    assert not str(unit).startswith(UnitId.prefix("pg-abc", 1))
    same_number_other_stage = _task(12, 3, task_id=902)
    assert UnitId("pg-abc", 12, 3, same_number_other_stage.attempt) != unit


def test_derived_sink_ids_are_stable_and_differ_by_target() -> None:
    assert derive_sink_id("pg", "q1", "t") == derive_sink_id("pg", "q1", "t")
    assert derive_sink_id("pg", "q1", "t") != derive_sink_id("pg", "q1", "u")
    assert derive_sink_id("pg", "q1", "t").startswith("pg-") and len(derive_sink_id("k", "q")) == 18


def test_retry_outcomes_are_retried_and_failure_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pauses: list[float] = []
    monkeypatch.setattr("eos_connectors.core.protocol.time.sleep", pauses.append)
    writer = _writer()
    real_commit = writer.commit_unit
    outcomes = iter([Outcome.RETRY, Outcome.RETRY])
    monkeypatch.setattr(
        writer, "commit_unit", lambda unit: next(outcomes, None) or real_commit(unit)
    )
    message = writer.prepare_task(_task(1), iter(_rows()))
    writer.commit([message], 1)
    assert message.unit in memory_server(writer.server_name).committed

    stuck = writer.prepare_task(_task(2, task_id=2), iter(_rows()))
    monkeypatch.setattr(writer, "commit_unit", lambda unit: Outcome.RETRY)
    pauses.clear()
    with pytest.raises(ProtocolError, match="restart the query and recovery commits it"):
        writer.commit([stuck], 2)
    # asked again for COMMIT_RETRY_SECONDS (a driver cut off its store for a while), never
    # more than 2 s apart
    assert COMMIT_RETRY_SECONDS <= sum(pauses) <= COMMIT_RETRY_SECONDS + 2, pauses
    assert max(pauses) == 2.0
    decision = writer.find_decision("s", 2)
    assert decision is not None and decision.units == (stuck.unit,)


def test_a_store_the_driver_cannot_reach_is_asked_again_before_claim_and_decision(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A driver cut off its store (nothing ran: ServiceUnavailableError) claims and
    decides once it answers again, within one batch's patience; past it, the error."""
    pauses: list[float] = []
    monkeypatch.setattr("eos_connectors.core.protocol.time.sleep", pauses.append)
    writer = _writer()
    cut = {"claim": 2, "decide": 3}
    for hook in cut:
        real = getattr(writer, hook)

        def flaky(*args: Any, _hook: str = hook, _real: Any = real) -> Any:
            if cut[_hook]:
                cut[_hook] -= 1
                raise ServiceUnavailableError("the store at ... is unreachable")
            return _real(*args)

        monkeypatch.setattr(writer, hook, flaky)
    message = writer.prepare_task(_task(1), iter(_rows()))
    writer.commit([message], 1)
    assert message.unit in memory_server(writer.server_name).committed
    assert pauses == [0.1, 0.2, 0.4, 0.8, 1.6]  # one patience for the whole batch

    cut["claim"] = 10**6  # never back
    pauses.clear()
    late = writer.prepare_task(_task(2, task_id=2), iter(_rows()))
    with pytest.raises(ServiceUnavailableError):
        writer.commit([late], 2)
    assert COMMIT_RETRY_SECONDS <= sum(pauses) <= COMMIT_RETRY_SECONDS + 2
    assert writer.find_decision("s", 2) is None


def test_recovery_commits_decided_and_rolls_back_undecided_earlier_units() -> None:
    writer = _writer()
    server = memory_server(writer.server_name)
    decided = writer.prepare_task(_task(3, 0, 1), iter(_rows())).unit
    assert decided is not None
    server.decisions[("s", 3)] = Decision("s", 3, "q", (decided,))
    undecided = writer.prepare_task(_task(4, 1, 2), iter(_rows())).unit
    later = writer.prepare_task(_task(9, 0, 3), iter(_rows())).unit
    assert undecided and later
    current = writer.prepare_task(_task(6, 0, 4), iter(_rows()))
    writer.commit([current], 6)
    assert server.committed == {decided, current.unit}
    assert writer.units_in_doubt("s") == [later], "a later batch is not this commit's business"


def test_a_batch_at_or_below_the_querys_watermark_writes_nothing() -> None:
    """Decisions of old batches are pruned; the watermark still stops a rewrite."""

    class WatermarkSink(MemorySink):
        def applied_watermark(self, sink_id: str, query_id: str) -> int:
            return {"q": 9}.get(query_id, -1)

    writer = WatermarkSink(f"unit-{uuid.uuid4().hex}", sink_id="s")
    assert writer.prepare_task(_task(9), iter(_rows())).skipped_decided
    assert writer.prepare_task(_task(10), iter(_rows())).unit is not None


def test_a_decision_by_another_query_is_refused() -> None:
    writer = _writer()
    memory_server(writer.server_name).decisions[("s", 0)] = Decision("s", 0, "old-query", ())
    with pytest.raises(ProtocolError, match="give this query its own sinkId"):
        writer.prepare_task(_task(0), iter(_rows()))


def test_commit_messages_must_belong_to_the_batch() -> None:
    writer = _writer()
    message = PreparedUnit("s", "q", 2, UnitId("s", 2, 0, "1-a"), 1)
    with pytest.raises(ProtocolError, match="Unexpected commit message for batch 3"):
        writer.commit([message], 3)


def test_a_batch_where_no_task_wrote_records_an_empty_decision() -> None:
    writer = _writer()
    empty = writer.prepare_task(_task(5), iter([rows_of([])]))
    assert empty.unit is None and not empty.skipped_decided
    writer.commit([empty], 5)
    decision = writer.find_decision("s", 5)
    assert decision is not None and decision.units == ()
