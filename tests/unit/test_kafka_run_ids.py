"""The transactional ids of the Kafka sink's batch commit: a batch job run's
(sinks/kafka/runs.py) and a task attempt's slot, what they are named, which marker group
they commit to, and which of them a sink's sweeps take. Cost: under 0.1 s."""

from __future__ import annotations

from eos_connectors.sinks.kafka.coordinator import _task
from eos_connectors.sinks.kafka.options import (
    ATTEMPT_SLOTS,
    attempt_slot,
    ids_prefix,
    marker_group,
    parse_options,
    transactional_id,
)
from eos_connectors.sinks.kafka.runs import POOL, RunClaim


def test_a_runs_ids_carry_its_slot_and_a_sinks_sweeps_take_them_alone() -> None:
    options = parse_options({"kafka.bootstrap.servers": "b:9092", "topic": "t", "sinkId": "a"})
    prefix = ids_prefix(options, "a")
    assert transactional_id(options, "a", 3) == f"{prefix}3"
    assert transactional_id(options, "a", 3, slot=5) == f"{prefix}3r5"
    assert _task("3", None) and _task("3r5", None), "a whole sweep misses a task's id"
    assert _task("3r5", 5) and not _task("3r4", 5) and not _task("3", 5)
    for other in ("b-0", "b-0r1", "decision", "claim", "3r", "r5", "3r5x", "3-r5", "3a", "3a5r1"):
        assert not _task(other, None), f"sink a's sweep takes {prefix}{other}"


def test_runs_take_turns_with_a_bounded_pool_of_slots() -> None:
    slots = {RunClaim(7, epoch).slot for epoch in range(100)}
    assert slots == set(range(POOL))
    assert RunClaim(7, 10).slot != RunClaim(7, 11).slot, "two claims in a row share ids"


def test_two_live_attempts_of_a_task_partition_take_two_ids_and_mark_one_group() -> None:
    """A stage resubmitted while its first attempt still runs gives task partition 3 two
    live attempts (task attempt ids 31 and 39 in the CI run that failed): with one id the
    later attempt's InitProducerId aborted the transaction Spark kept. Each attempt has
    its slot's id now; both commit their marker to the task partition's (or the run's)
    one group, and the sweeps take every slot's id."""
    options = parse_options({"kafka.bootstrap.servers": "b:9092", "topic": "t", "sinkId": "a"})
    prefix = ids_prefix(options, "a")
    first, second = (transactional_id(options, "a", 3, None, attempt_slot(t)) for t in (31, 39))
    assert first != second, "two live attempts share an id"
    assert {marker_group(first), marker_group(second)} == {f"{prefix}3"}
    assert transactional_id(options, "a", 3, None, 0) == f"{prefix}3", "slot 0 keeps the id"
    run = transactional_id(options, "a", 3, 5, 7)
    assert run == f"{prefix}3r5a7" and marker_group(run) == f"{prefix}3r5"
    assert _task("3a7", None) and _task("3r5a7", None) and _task("3r5a7", 5)
    assert not _task("3a7", 5) and not _task("3r4a7", 5)
    assert {attempt_slot(t) for t in range(100)} == set(range(ATTEMPT_SLOTS)), "bounded"
    assert all(attempt_slot(t) != attempt_slot(t + 1) for t in range(100)), "neighbours share"
