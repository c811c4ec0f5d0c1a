"""Where a checkpoint stands, and the refusals of one behind its sink's decisions
(tests/services/test_checkpoint_behind.py runs them against the stores). Cost: <1 s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eos_connectors.core.checkpoint_behind import (
    CheckpointBehindSinkError,
    planned_offsets,
    refuse_at_commit,
    refuse_at_start,
    refuse_replanned,
)
from eos_connectors.core.checkpoint_sinks import Planned, planned_batches
from eos_connectors.core.sink_switch import starting_sink


def _batches(folder: Path, log: str, *batches: int) -> None:
    (folder / log).mkdir(parents=True, exist_ok=True)
    for batch in batches:
        (folder / log / str(batch)).write_text(f'v1\n{{}}\n{{"t":{{"0":{batch}}}}}\n')


def test_where_a_checkpoint_stands(tmp_path: Path) -> None:
    assert planned_batches(str(tmp_path)) == Planned(-1, True)
    _batches(tmp_path, "offsets", 0, 1, 2)
    _batches(tmp_path, "commits", 0, 1)
    (tmp_path / "offsets" / ".2.tmp").write_text("")  # Spark's unfinished write: not a batch
    over = planned_offsets((tmp_path / "offsets" / "2").read_text())
    assert over != planned_offsets((tmp_path / "offsets" / "1").read_text())
    assert planned_batches(str(tmp_path)) == Planned(2, False, over)
    assert planned_batches(f"file://{tmp_path}") == Planned(2, False, over)
    assert Planned(2, False).incomplete == 2
    _batches(tmp_path, "commits", 2)
    assert planned_batches(str(tmp_path)) == Planned(2, True, over)
    assert Planned(2, True).incomplete is None and Planned(-1, True).incomplete is None
    assert planned_batches("s3a://bucket/checkpoint") is None


def test_a_clean_checkpoint_starts_a_sink_too(tmp_path: Path) -> None:
    """The start checks get the sink on a clean restart as well (the behind check needs
    it); only the switch checks wait for a batch to replay."""
    raw = {"checkpointLocation": str(tmp_path)}
    assert starting_sink(raw, lambda q: f"s-{q}", "eos_x") is None  # no query id yet
    (tmp_path / "metadata").write_text(json.dumps({"id": "q1"}))
    _batches(tmp_path, "offsets", 0)
    _batches(tmp_path, "commits", 0)
    starting = starting_sink(raw, lambda q: f"s-{q}", "eos_x")
    assert starting is not None and starting.sink_id == "s-q1"
    assert starting.planned.last == 0 and starting.incomplete is None
    assert not starting.replays(0)


def test_only_a_decision_past_the_checkpoint_is_refused() -> None:
    refuse_at_start("eos_x", "s", "q", None, "/c", -1)  # a sink that decided nothing
    refuse_at_start("eos_x", "s", "q", 4, "/c", 4)  # the replay of its last batch
    refuse_at_start("eos_x", "s", "q", 3, "/c", 4)  # the batch after its last
    with pytest.raises(
        CheckpointBehindSinkError, match=r"batch 0, .* no batch: .* plan batch 0 again"
    ):
        refuse_at_start("eos_x", "s", "q", 0, "/c", -1)
    with pytest.raises(
        CheckpointBehindSinkError, match=r"decided batch 9, .* up to batch 4: .* batches 5-9 again"
    ):
        refuse_at_start("eos_x", "s", "q", 9, "/c", 4)
    refuse_at_commit("eos_x", "s", 4, 4)
    refuse_at_commit("eos_x", "s", 4, -1)  # a store that keeps no watermark
    with pytest.raises(CheckpointBehindSinkError, match=r"batch 4 .* up to batch 5.*sinkId"):
        refuse_at_commit("eos_x", "s", 4, 5)


def test_a_batch_write_outside_a_stream_is_never_refused() -> None:
    """Outside a Spark task (and so outside any stream) a version below the job's highest
    is a rerun, as batch-writes.md says; tests/spark/test_batch_write.py refuses one in a
    stream's foreachBatch."""
    from eos_connectors.core.checkpoint_behind import refuse_in_foreach_batch

    refuse_in_foreach_batch("eos_x", "job", 3, 7)
    refuse_in_foreach_batch("eos_x", "job", 7, 7)


def test_a_batch_planned_again_is_told_from_its_replay_by_its_source_positions() -> None:
    """A replay reads the very ``offsets/N`` file its batch was decided over; a batch
    planned again after the file was deleted has another batch time in its metadata
    line, which does not count, and other source positions, which do."""
    first = 'v1\n{"batchTimestampMs":1}\n{"orders":{"0":500}}'
    same_positions = 'v1\n{"batchTimestampMs":2}\n{"orders":{"0":500}}\n'
    other_positions = 'v1\n{"batchTimestampMs":2}\n{"orders":{"0":1500}}'
    assert planned_offsets(first) == planned_offsets(same_positions) != ""
    assert planned_offsets(first) != planned_offsets(other_positions)
    assert planned_offsets(None) == ""
    refuse_replanned("eos_x", "s", 4, planned_offsets(first), planned_offsets(same_positions))
    refuse_replanned("eos_x", "s", 4, "", planned_offsets(first))  # decided before digests
    refuse_replanned("eos_x", "s", 4, planned_offsets(first), "")  # unreadable checkpoint
    with pytest.raises(CheckpointBehindSinkError, match=r"batch 4 .* other source positions"):
        refuse_replanned("eos_x", "s", 4, planned_offsets(first), planned_offsets(other_positions))


def test_a_start_over_a_batch_planned_again_is_refused() -> None:
    """A checkpoint put back by one batch and restarted once holds the batch planned
    again, whose commit was refused: the next start (a new driver) refuses it before any
    task runs, where the store keeps the decision's source positions."""
    decided, again = planned_offsets("v1\n{}\n{}"), planned_offsets('v1\n{}\n{"t":1}')
    refuse_at_start("eos_x", "s", "q", 4, "/c", 4, (decided, decided))  # its replay
    refuse_at_start("eos_x", "s", "q", 4, "/c", 4, ("", again))  # the store keeps none
    refuse_at_start("eos_x", "s", "q", 3, "/c", 4, (decided, again))  # an earlier batch's
    with pytest.raises(CheckpointBehindSinkError, match=r"batch 4 .* other source positions"):
        refuse_at_start("eos_x", "s", "q", 4, "/c", 4, (decided, again))


def test_the_refusal_says_to_settle_only_where_eos_sinks_settle_commits() -> None:
    """Reprocessing on purpose takes a new sink id; a batch the old one decided but did not
    finish stays prepared in PostgreSQL (row locks) or staged in Redis until settled. A
    Kafka sink's open transactions end at their timeout, and ``eos sinks settle`` does
    nothing there, so its refusal does not send the user to it."""
    for connector, settles in (("eos_postgres", True), ("eos_redis", True), ("eos_kafka", False)):
        with pytest.raises(CheckpointBehindSinkError) as refused:
            refuse_at_commit(connector, "orders", 4, 9)
        assert ("eos sinks settle orders" in str(refused.value)) is settles, connector
        assert "another sinkId than 'orders'" in str(refused.value)
