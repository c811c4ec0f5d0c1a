"""A batch job run's transactional ids in the Kafka sink's batch commit (sinks/kafka/runs.py):
what they are named, and which of them a sink's sweeps take. Cost: under 0.1 s."""

from __future__ import annotations

from eos_connectors.sinks.kafka.coordinator import _task
from eos_connectors.sinks.kafka.options import ids_prefix, parse_options, transactional_id
from eos_connectors.sinks.kafka.runs import POOL, RunClaim


def test_a_runs_ids_carry_its_slot_and_a_sinks_sweeps_take_them_alone() -> None:
    options = parse_options({"kafka.bootstrap.servers": "b:9092", "topic": "t", "sinkId": "a"})
    prefix = ids_prefix(options, "a")
    assert transactional_id(options, "a", 3) == f"{prefix}3"
    assert transactional_id(options, "a", 3, slot=5) == f"{prefix}3r5"
    assert _task("3", None) and _task("3r5", None), "a whole sweep misses a task's id"
    assert _task("3r5", 5) and not _task("3r4", 5) and not _task("3", 5)
    for other in ("b-0", "b-0r1", "decision", "claim", "3r", "r5", "3r5x", "3-r5"):
        assert not _task(other, None), f"sink a's sweep takes {prefix}{other}"


def test_runs_take_turns_with_a_bounded_pool_of_slots() -> None:
    slots = {RunClaim(7, epoch).slot for epoch in range(100)}
    assert slots == set(range(POOL))
    assert RunClaim(7, 10).slot != RunClaim(7, 11).slot, "two claims in a row share ids"
