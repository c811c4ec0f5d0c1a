from __future__ import annotations

import pickle
from collections.abc import Sequence

import pytest

from eos_connectors.core.errors import ConfigError
from eos_connectors.sources.kafka.offsets import (
    PLANNER,
    KafkaRange,
    KafkaRanges,
    SourceOffset,
    Split,
    from_spark,
    limit_offsets,
    moved_back,
    pack_ranges,
    plan_ranges,
    to_spark,
)
from eos_connectors.sources.kafka.options import parse_options
from eos_connectors.sources.kafka.stream_reader import KafkaStreamReader


def test_spark_form_round_trips() -> None:
    offsets = {("t", 0): 5, ("t", 10): 7, ("u", 1): 0}
    spark = to_spark(offsets)
    assert spark == {"t": {"0": 5, "10": 7}, "u": {"1": 0}}
    assert from_spark(spark) == offsets


def test_limit_is_shared_by_backlog_and_never_exceeded() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    latest = {("t", 0): 300, ("t", 1): 200, ("t", 2): 50}
    end = limit_offsets(start, latest, 100)
    assert sum(end[tp] - start[tp] for tp in start) == 100
    assert end == {("t", 0): 75, ("t", 1): 125, ("t", 2): 50}


def test_limit_is_deterministic_with_remainders() -> None:
    start = {("t", p): 0 for p in range(3)}
    latest = {("t", p): 10 for p in range(3)}
    ends = [limit_offsets(start, latest, 10) for _ in range(3)]
    assert ends[0] == ends[1] == ends[2]
    assert sum(ends[0].values()) == 10
    assert ends[0] == {("t", 0): 4, ("t", 1): 3, ("t", 2): 3}


def test_limit_above_backlog_reads_everything() -> None:
    start = {("t", 0): 3}
    latest = {("t", 0): 10}
    assert limit_offsets(start, latest, 1000) == latest


def test_plan_skips_empty_ranges_and_splits_for_min_partitions() -> None:
    start = {("t", 0): 0, ("t", 1): 10, ("t", 2): 5}
    end = {("t", 0): 300, ("t", 1): 10, ("t", 2): 105}
    assert plan_ranges(start, end, None) == [KafkaRange("t", 0, 0, 300), KafkaRange("t", 2, 5, 105)]
    split = plan_ranges(start, end, 8)
    assert [(r.partition, r.start, r.end) for r in split if r.partition == 0] == [
        (0, 0, 50),
        (0, 50, 100),
        (0, 100, 150),
        (0, 150, 200),
        (0, 200, 250),
        (0, 250, 300),
    ]
    assert [(r.start, r.end) for r in split if r.partition == 2] == [(5, 55), (55, 105)]
    assert split == plan_ranges(start, end, 8)  # a replay plans the same tasks


def test_ranges_pickle() -> None:
    work = KafkaRange("t", 1, 2, 3)
    assert pickle.loads(pickle.dumps(work)) == work


def test_source_offset_round_trips_with_ids_and_starts() -> None:
    offset = SourceOffset({("t", 0): 5, ("t", 1): 2}, {"t": "id-1"}, {("t", 1): 0})
    spark = offset.to_spark()
    assert spark == {"t": {"0": 5, "1": 2}, "@topicIds": {"t": "id-1"}, "@starts": {"t": {"1": 0}}}
    assert SourceOffset.from_spark(spark) == offset
    assert from_spark(spark) == offset.ends  # the "@" entries are never read as topics
    assert SourceOffset.from_spark({"t": {"0": 5}}) == SourceOffset({("t", 0): 5})  # older form


def test_offsets_that_go_back_or_a_new_topic_id_are_found() -> None:
    previous = SourceOffset({("t", 0): 6, ("t", 1): 6, ("u", 0): 4}, {"t": "a", "u": "b"})
    assert moved_back(previous, {("t", 0): 6, ("t", 1): 9, ("u", 0): 4}, {"t": "a", "u": "b"}) == {}
    back = moved_back(previous, {("t", 0): 3, ("t", 1): 9, ("u", 0): 7}, {"t": "a", "u": "c"})
    assert sorted(back) == [("t", 0), ("u", 0)]
    assert "t-0 now ends at offset 3, below the offset 6" in back[("t", 0)].why
    assert (back[("t", 0)].recreated, back[("t", 0)].same_topic) == (False, True)  # truncated
    assert "topic 'u' was deleted and recreated (its id changed from b to c)" in back[("u", 0)].why
    assert (back[("u", 0)].recreated, back[("u", 0)].same_topic) == (True, False)
    unknown_ids = SourceOffset({("t", 0): 6})  # a checkpoint written before ids were kept
    assert moved_back(unknown_ids, {("t", 0): 8}, {"t": "a"}) == {}
    assert not moved_back(unknown_ids, {("t", 0): 2}, {"t": "a"})[("t", 0)].same_topic
    assert moved_back(previous, {("n", 0): 0}, {}) == {}  # new partitions are not "back"


def test_a_replay_plans_a_new_partition_from_its_checkpointed_start() -> None:
    """partitions() takes the start recorded in the offsets, and asks no broker for it."""
    reader = KafkaStreamReader(
        parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"})
    )
    start = SourceOffset({("t", 0): 4}, {"t": "a"}).to_spark()
    end = SourceOffset({("t", 0): 9, ("t", 1): 7}, {"t": "a"}, {("t", 1): 2}).to_spark()
    planned = reader.partitions(start, end)
    assert planned == [KafkaRange("t", 0, 4, 9), KafkaRange("t", 1, 2, 7)]
    assert reader._broker is None  # planning never made a broker client


class _CountingBroker:
    """The broker calls latestOffset makes, answered from memory and counted."""

    def __init__(self) -> None:
        self.latest_calls = 0
        self.ends = {("t", 0): 9}

    def partitions(self) -> list[tuple[str, int]]:
        return list(self.ends)

    def latest(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        self.latest_calls += 1
        return {tp: self.ends[tp] for tp in partitions}

    def topic_ids(self, topics: object) -> dict[str, str]:
        return {"t": "a"}


def test_the_progress_report_reuses_latest_offsets_look_up() -> None:
    """reportLatestOffset, which Spark calls right after latestOffset, asks no broker again;
    called on its own, it does."""
    from eos_connectors.core.spark_api import ReadAllAvailable

    reader = KafkaStreamReader(
        parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"})
    )
    broker = _CountingBroker()
    reader._broker = broker  # type: ignore[assignment]
    start = SourceOffset({("t", 0): 4}, {"t": "a"}).to_spark()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert from_spark(end) == {("t", 0): 9}
    assert from_spark(reader.reportLatestOffset() or {}) == {("t", 0): 9}
    assert broker.latest_calls == 1
    broker.ends = {("t", 0): 12}
    assert from_spark(reader.reportLatestOffset() or {}) == {("t", 0): 12}
    assert broker.latest_calls == 2


@pytest.mark.parametrize("planner", [1, 2])
def test_pack_puts_every_range_into_at_most_max_tasks_the_same_way_every_time(
    planner: int,
) -> None:
    sizes = {0: 500, 1: 100, 2: 300, 3: 250, 4: 50}
    ranges = [KafkaRange("t", p, 1000, 1000 + n) for p, n in sizes.items()]
    tasks = pack_ranges(ranges, 2, planner)
    again = pack_ranges(list(reversed(ranges)), 2, planner)
    assert tasks == again, "packing depends on the input order"
    assert len(tasks) == 2 and all(isinstance(t, KafkaRanges) for t in tasks)
    packed = [r for t in tasks if isinstance(t, KafkaRanges) for r in t.ranges]
    assert sorted(packed, key=str) == sorted(ranges, key=str), "a range was lost or read twice"
    # planner 1: largest first, each to the emptiest task; 2: consecutive runs
    assert [t.size for t in tasks] == [600, 600]
    assert pack_ranges(ranges, 5) == ranges and pack_ranges(ranges, None) == ranges
    single = pack_ranges(ranges[:3], 2)
    assert single[0] == KafkaRange("t", 0, 1000, 1500), "a lone range stays a plain range"
    assert pickle.loads(pickle.dumps(tasks[1])) == tasks[1]


def test_a_batch_is_split_as_its_offset_recorded_whatever_the_options_say_now() -> None:
    """The split belongs to the batch: planned with minPartitions=4, a replay planned by a
    reader now configured with minPartitions=2 (or maxPartitions=1) makes the same 4
    tasks, so each task partition of a sink gets the records it got the first time."""
    start = SourceOffset({("t", 0): 0, ("t", 1): 0}).to_spark()
    end = SourceOffset({("t", 0): 1000, ("t", 1): 1000}, split=Split(4, None)).to_spark()
    assert end["@split"] == {"minPartitions": 4, "maxPartitions": None}
    assert SourceOffset.from_spark(end).split == Split(4, None)

    def tasks(**options: str) -> list[tuple[int, int, int]]:
        raw = {"kafka.bootstrap.servers": "unused:9092", "subscribe": "t", **options}
        planned = KafkaStreamReader(parse_options(raw)).partitions(start, end)
        return [(r.partition, r.start, r.end) for r in planned if isinstance(r, KafkaRange)]

    first = [(0, 0, 500), (0, 500, 1000), (1, 0, 500), (1, 500, 1000)]
    assert tasks(minPartitions="4") == first
    assert tasks(minPartitions="2") == first
    assert tasks(maxPartitions="1") == first
    # An offset written before splits were recorded is planned with today's options.
    unrecorded = SourceOffset({("t", 0): 1000, ("t", 1): 1000}).to_spark()
    reader = KafkaStreamReader(
        parse_options(
            {"kafka.bootstrap.servers": "unused:9092", "subscribe": "t", "minPartitions": "2"}
        )
    )
    assert len(reader.partitions(start, unrecorded)) == 2


def _pieces(tasks: Sequence[object]) -> list[list[tuple[int, int]]]:
    pieces = []
    for task in tasks:
        assert isinstance(task, KafkaRange | KafkaRanges)
        ranges = task.ranges if isinstance(task, KafkaRanges) else (task,)
        pieces.append([(r.start, r.end) for r in ranges])
    return pieces


def test_packed_pieces_of_a_partition_are_read_in_offset_order() -> None:
    """Planner 1 read [66,100) before [0,33) in one task (maxRecordsPerPartition=40,
    maxPartitions=1), and gave task 0 the later offsets with maxRecordsPerPartition=34,
    maxPartitions=2: a key written twice kept its older value."""
    whole = {("t", 0): 100}
    start = {("t", 0): 0}
    one_task = pack_ranges(plan_ranges(start, whole, None, 40), 1)
    assert _pieces(one_task) == [[(0, 33), (33, 66), (66, 100)]]
    two_tasks = pack_ranges(plan_ranges(start, whole, None, 34), 2)
    assert _pieces(two_tasks) == [[(0, 33), (33, 66)], [(66, 100)]]
    old = pack_ranges(plan_ranges(start, whole, None, 40), 1, planner=1)
    assert _pieces(old) == [[(66, 100), (0, 33), (33, 66)]], "planner 1 is kept as it was"


def test_a_batch_is_packed_by_the_planner_its_offset_names() -> None:
    """An upgrade never re-splits a batch in flight: an offset of 0.2 (no planner) is
    packed as 0.2 packed it; a new one records planner 2."""
    start = SourceOffset({("t", 0): 0}).to_spark()
    old_end = SourceOffset({("t", 0): 100}, split=Split(None, 1, 40)).to_spark()
    assert "planner" not in old_end["@split"]
    raw = {"kafka.bootstrap.servers": "unused:9092", "subscribe": "t"}
    reader = KafkaStreamReader(parse_options(raw))
    assert _pieces(reader.partitions(start, old_end)) == [[(66, 100), (0, 33), (33, 66)]]
    new_end = SourceOffset({("t", 0): 100}, split=Split(None, 1, 40, PLANNER)).to_spark()
    assert new_end["@split"]["planner"] == PLANNER == 2
    assert _pieces(reader.partitions(start, new_end)) == [[(0, 33), (33, 66), (66, 100)]]
    newer = SourceOffset({("t", 0): 100}, split=Split(None, 1, 40, 9)).to_spark()
    with pytest.raises(ConfigError, match="planner 9"):
        reader.partitions(start, newer)
