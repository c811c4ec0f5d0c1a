"""The driver side of ``eos_kafka``: initial offsets, latest offsets under a read limit, planning.

Spark writes what :meth:`KafkaStreamReader.latestOffset` returns to ``offsets/N``
before batch N runs; on restart it replays batch N from ``offsets/N-1`` to
``offsets/N``, and :meth:`partitions` plans the very same ranges again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from sources.kafka.broker import BrokerView
from sources.kafka.offsets import (
    KafkaRange,
    Offsets,
    from_spark,
    limit_offsets,
    plan_ranges,
    to_spark,
)
from sources.kafka.options import KafkaSourceOptions
from sources.kafka.read import read_range

log = logging.getLogger(__name__)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._broker: BrokerView | None = None
        self._available_now: Offsets | None = None
        self._published: Offsets | None = None

    @property
    def broker(self) -> BrokerView:
        if self._broker is None:
            self._broker = BrokerView(self.options)
        return self._broker

    def initialOffset(self) -> dict[str, Any]:
        return to_spark(self.broker.initial())

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._latest_now()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        begin = from_spark(start)
        self._publish(begin)  # Spark plans the next batch only after the previous one completed
        latest = self._available_now or self._latest_now()
        latest = {tp: max(offset, begin.get(tp, offset)) for tp, offset in latest.items()}
        begin_new = self._with_new_partitions(begin, latest)
        if isinstance(limit, ReadMaxRows):
            latest = limit_offsets(begin_new, latest, limit.max_rows)
        for tp, offset in begin.items():  # a partition no longer listed keeps its position
            latest.setdefault(tp, offset)
        return to_spark(latest)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return to_spark(self._latest_now())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begin = self._with_new_partitions(from_spark(start), from_spark(end))
        return plan_ranges(begin, from_spark(end), self.options.min_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaRange)
        return read_range(self.options, partition)

    def commit(self, end: dict[str, Any]) -> None:
        self._publish(from_spark(end))

    def _publish(self, offsets: Offsets) -> None:
        """Mirror processed offsets to ``publishOffsetsToGroup`` (for lag tools), once each.

        Spark calls ``commit`` lazily (not at all for the last batch of an
        availableNow run), so the start of every ``latestOffset`` call, which is
        the end of a completed batch, is published too.
        """
        if not self.options.publish_group or not offsets or offsets == self._published:
            return
        from sources.kafka.lag import publish_offsets

        publish_offsets(self.options, offsets)
        self._published = dict(offsets)

    def stop(self) -> None:
        self._broker = None

    def _latest_now(self) -> Offsets:
        return self.broker.latest(self.broker.partitions())

    def _with_new_partitions(self, begin: Offsets, end: Offsets) -> Offsets:
        """``begin`` plus partitions that appeared since, starting at their earliest offset.

        The earliest offset only moves through retention, so a replay plans the same
        start (or reports the loss through failOnDataLoss when reading).
        """
        new = [tp for tp in end if tp not in begin]
        if not new:
            return begin
        log.info("eos_kafka: new partitions %s start at their earliest offset", new)
        return {**begin, **self.broker.earliest(new)}
