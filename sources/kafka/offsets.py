"""Offsets as Spark checkpoints them, read limits, and the split of a batch into tasks.

Everything here is a pure function of its arguments, so replaying batch N plans
exactly the same ranges as the first attempt did.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

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


def to_spark(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """``{"topic": {"partition": next_offset}}``, the form written to ``offsets/N``."""
    result: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        result.setdefault(topic, {})[str(partition)] = int(offset)
    return result


def from_spark(value: Mapping[str, Mapping[str, int]]) -> Offsets:
    return {
        (topic, int(partition)): int(offset)
        for topic, partitions in value.items()
        for partition, offset in partitions.items()
    }


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


def plan_ranges(start: Offsets, end: Offsets, min_partitions: int | None) -> list[KafkaRange]:
    """Non-empty ranges [start, end) per partition, split to reach ``min_partitions`` tasks."""
    ranges = [
        KafkaRange(topic, partition, start[(topic, partition)], stop)
        for (topic, partition), stop in sorted(end.items())
        if stop > start[(topic, partition)]
    ]
    if not min_partitions or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)
    return [piece for r in ranges for piece in _split(r, round(r.size / total * min_partitions))]


def _split(whole: KafkaRange, parts: int) -> list[KafkaRange]:
    parts = max(1, min(parts, whole.size))
    bounds = [whole.start + whole.size * i // parts for i in range(parts + 1)]
    return [
        KafkaRange(whole.topic, whole.partition, lo, hi) for lo, hi in itertools.pairwise(bounds)
    ]
