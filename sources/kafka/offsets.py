"""Offsets as Spark checkpoints them, read limits, and the split of a batch into tasks.

Everything here is a pure function of its arguments, so replaying batch N plans
exactly the same ranges as the first attempt did.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import InputPartition

from eos_connectors.core.errors import ConfigError

TopicPartitionKey = tuple[str, int]
Offsets = dict[TopicPartitionKey, int]


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    """One task's work: offsets [start, end) of one topic partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class KafkaRanges(InputPartition):
    """One task's work when a batch has more ranges than ``maxPartitions``: several ranges,
    read one after the other by one pooled consumer."""

    ranges: tuple[KafkaRange, ...]

    @property
    def size(self) -> int:
        return sum(r.size for r in self.ranges)


def to_spark(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """``{"topic": {"partition": next_offset}}``, the form written to ``offsets/N``."""
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def from_spark(value: Mapping[str, Any]) -> Offsets:
    """The end offsets of ``offsets/N`` (the ``@`` entries of :class:`SourceOffset` left out)."""
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in value.items()
        if not topic.startswith("@")
        for partition, offset in partitions.items()
    }


# Kafka topic names are made of [a-zA-Z0-9._-], so an "@" key never names a topic.
TOPIC_IDS = "@topicIds"
STARTS = "@starts"
SPLIT = "@split"


@dataclass(frozen=True)
class Split:
    """How a batch's ranges are split into tasks: ``minPartitions``, ``maxPartitions`` and
    ``maxRecordsPerPartition`` as they were when the batch was planned.

    It belongs to the batch, not to today's options: a sink that marks progress per
    task partition (the Kafka sink) must see a replayed batch split into the very
    same tasks, or a task partition's marker speaks of other records than the replay
    gives it (records lost, or written twice, after a restart with another
    ``minPartitions``).
    """

    min_partitions: int | None = None
    max_partitions: int | None = None
    max_records_per_partition: int | None = None
    #: The packing algorithm that planned the batch (:data:`PLANNER`); 1 in an offset
    #: that names none (written by 0.2 or earlier).
    planner: int = 1

    def to_spark(self) -> dict[str, int | None]:
        value = {"minPartitions": self.min_partitions, "maxPartitions": self.max_partitions}
        if self.max_records_per_partition is not None:
            value["maxRecordsPerPartition"] = self.max_records_per_partition
        if self.planner != 1:
            value["planner"] = self.planner
        return value

    @classmethod
    def from_spark(cls, value: Mapping[str, Any]) -> Split:
        return cls(
            _optional_int(value.get("minPartitions")),
            _optional_int(value.get("maxPartitions")),
            _optional_int(value.get("maxRecordsPerPartition")),
            int(value.get("planner", 1)),
        )


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class SourceOffset:
    """What ``offsets/N`` holds: where batch N ends, and what batch N+1 must check.

    ``topic_ids`` are the ids the brokers gave each topic (Kafka 4 topics carry
    one), so a topic deleted and recreated under the same name is told apart
    from the old one. ``starts`` names the partitions batch N reads from a
    position decided while planning it (a partition that appeared, or one
    whose log went back, read from its log start) instead of from batch N-1's
    end: checkpointed, so a replay of batch N plans exactly the same ranges.
    ``split`` is how batch N is split into tasks (:class:`Split`); None in an
    offset written by a version of this package that did not record it.
    """

    ends: Offsets
    topic_ids: Mapping[str, str] = field(default_factory=dict)
    starts: Offsets = field(default_factory=dict)
    split: Split | None = None

    def to_spark(self) -> dict[str, Any]:
        value: dict[str, Any] = to_spark(self.ends)
        if self.topic_ids:
            value[TOPIC_IDS] = dict(sorted(self.topic_ids.items()))
        if self.starts:
            value[STARTS] = to_spark(self.starts)
        if self.split is not None:
            value[SPLIT] = self.split.to_spark()
        return value

    @classmethod
    def from_spark(cls, value: Mapping[str, Any]) -> SourceOffset:
        split = value.get(SPLIT)
        return cls(
            ends=from_spark(value),
            topic_ids=dict(value.get(TOPIC_IDS, {})),
            starts=from_spark(value.get(STARTS, {})),
            split=Split.from_spark(split) if isinstance(split, Mapping) else None,
        )

    def begin_of_next(self, following: SourceOffset) -> Offsets:
        """Where the batch ending at ``following`` starts: this batch's ends, overridden."""
        return {**self.ends, **following.starts}


@dataclass(frozen=True)
class MovedBack:
    """A partition whose log no longer continues the checkpoint's position, and why.

    ``recreated`` when its topic's id changed (a new topic under the old name: read it
    from its start); else its log was truncated below the position (an unclean leader
    election) and, when the id is known to be the same, its records below the new end
    were read already: reading goes on from the new end."""

    why: str
    recreated: bool
    same_topic: bool


def moved_back(
    previous: SourceOffset, latest: Mapping[TopicPartitionKey, int], ids: Mapping[str, str]
) -> dict[TopicPartitionKey, MovedBack]:
    """Partitions of ``latest`` whose log no longer continues ``previous``, and why.

    Either the topic's id changed (deleted and recreated), or the partition now
    ends below the offset the checkpoint reached (recreated, or truncated by an
    unclean leader election). Offsets never go back otherwise: the last stable
    offset and the high watermark only grow.
    """
    found = {}
    for (topic, partition), end in sorted(latest.items()):
        reached = previous.ends.get((topic, partition))
        if reached is None:
            continue
        old_id, new_id = previous.topic_ids.get(topic), ids.get(topic)
        if old_id and new_id and old_id != new_id:
            found[(topic, partition)] = MovedBack(
                f"topic {topic!r} was deleted and recreated (its id changed from {old_id} to "
                f"{new_id}); the checkpoint had read partition {partition} up to offset "
                f"{reached} of the old topic",
                recreated=True,
                same_topic=False,
            )
        elif end < reached:
            found[(topic, partition)] = MovedBack(
                f"{topic}-{partition} now ends at offset {end}, below the offset {reached} the "
                "checkpoint had read up to (the topic was recreated, or its log truncated by "
                "an unclean leader election)",
                recreated=False,
                same_topic=bool(old_id and new_id),
            )
    return found


def limit_offsets(start: Offsets, latest: Offsets, max_records: int) -> Offsets:
    """End offsets that read at most ``max_records`` past ``start``, shared by backlog.

    Each partition gets ``max_records * backlog / total`` rounded down; the records
    left over by rounding go one each to the partitions with the largest remainders
    (ties broken by topic and partition, so the answer is deterministic).
    """
    backlog = {tp: max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest}
    total = sum(backlog.values())
    if total <= max_records:
        return dict(latest)
    shares = {tp: max_records * size // total for tp, size in backlog.items()}
    leftover = max_records - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda tp: (-(max_records * backlog[tp] % total), tp))
    for tp in by_remainder[:leftover]:
        shares[tp] += 1
    return {tp: start.get(tp, latest[tp]) + min(shares[tp], backlog[tp]) for tp in latest}


def plan_ranges(
    start: Offsets, end: Offsets, min_partitions: int | None, max_records: int | None = None
) -> list[KafkaRange]:
    """Non-empty ranges [start, end) per partition, split to reach ``min_partitions`` tasks
    and so that none holds more than ``max_records`` offsets (Spark's
    ``maxRecordsPerPartition``)."""
    ranges = [
        KafkaRange(topic, partition, start[(topic, partition)], stop)
        for (topic, partition), stop in sorted(end.items())
        if stop > start[(topic, partition)]
    ]
    if min_partitions and min_partitions > len(ranges):
        total = sum(r.size for r in ranges)
        ranges = [p for r in ranges for p in _split(r, round(r.size / total * min_partitions))]
    if max_records:
        ranges = [p for r in ranges for p in _split(r, -(-r.size // max_records))]
    return ranges


def _split(whole: KafkaRange, parts: int) -> list[KafkaRange]:
    parts = max(1, min(parts, whole.size))
    bounds = [whole.start + whole.size * i // parts for i in range(parts + 1)]
    return [
        KafkaRange(whole.topic, whole.partition, lo, hi) for lo, hi in itertools.pairwise(bounds)
    ]


#: The algorithm :func:`pack_ranges` packs new batches with. 1 (0.2 and earlier) took
#: pieces largest first, so one task could read a partition's later offsets before its
#: earlier ones, and a later task a partition's earlier offsets; 2 keeps offset order.
#: A batch is re-planned with the algorithm its offset names, so an upgrade never
#: re-splits a batch in flight.
PLANNER = 2


def pack_ranges(
    ranges: list[KafkaRange], max_tasks: int | None, planner: int = PLANNER
) -> list[KafkaRange | KafkaRanges]:
    """At most ``max_tasks`` tasks (:data:`PLANNER`). A pure function of its arguments,
    so a replay plans the same tasks."""
    if not max_tasks or len(ranges) <= max_tasks:
        return list(ranges)
    if planner not in (1, 2):
        raise ConfigError(
            f"This batch's offset names task planner {planner}, which this version of "
            "eos_kafka does not have: it was planned by a newer version. Run the query with "
            "that version (or a newer one) until the batch is committed."
        )
    pack = _pack_largest_first if planner == 1 else _pack_in_offset_order
    tasks = [task for task in pack(ranges, max_tasks) if task]
    return [task[0] if len(task) == 1 else KafkaRanges(tuple(task)) for task in tasks]


def _pack_in_offset_order(ranges: list[KafkaRange], max_tasks: int) -> list[list[KafkaRange]]:
    """Planner 2: the ranges in (topic, partition, offset) order, cut into consecutive
    runs of about equal size (a range goes to the task whose share holds its middle).
    A task reads its ranges in offset order, and a partition's ranges go to tasks in
    offset order: a key written twice is read in the order it was written."""
    ordered = sorted(ranges, key=lambda r: (r.topic, r.partition, r.start))
    total = sum(r.size for r in ordered)
    tasks: list[list[KafkaRange]] = [[] for _ in range(max_tasks)]
    done = 0
    for piece in ordered:
        middle = done + piece.size // 2
        tasks[min(max_tasks - 1, middle * max_tasks // total)].append(piece)
        done += piece.size
    return tasks


def _pack_largest_first(ranges: list[KafkaRange], max_tasks: int) -> list[list[KafkaRange]]:
    """Planner 1, kept for batches it planned: each range, largest first, to the task
    with the fewest offsets so far (the first such on a tie)."""
    tasks: list[list[KafkaRange]] = [[] for _ in range(max_tasks)]
    sizes = [0] * max_tasks
    for piece in sorted(ranges, key=lambda r: (-r.size, r.topic, r.partition, r.start)):
        emptiest = min(range(max_tasks), key=lambda i: (sizes[i], i))
        tasks[emptiest].append(piece)
        sizes[emptiest] += piece.size
    return tasks
