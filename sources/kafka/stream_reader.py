"""The driver side of ``eos_kafka``: initial offsets, latest offsets under a read limit, planning.

Spark writes what :meth:`KafkaStreamReader.latestOffset` returns to ``offsets/N``
before batch N runs; on restart it replays batch N from ``offsets/N-1`` to
``offsets/N``, and :meth:`partitions` plans the very same ranges again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from eos_connectors.core.errors import EosError
from eos_connectors.core.spark_api import (
    HAS_READ_LIMITS,
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
    release,
)
from eos_connectors.sources.kafka.broker import BrokerView
from eos_connectors.sources.kafka.data_loss import report_data_loss
from eos_connectors.sources.kafka.offsets import (
    PLANNER,
    Offsets,
    SourceOffset,
    Split,
    from_spark,
    limit_offsets,
    moved_back,
    pack_ranges,
    plan_ranges,
    to_spark,
)
from eos_connectors.sources.kafka.options import KafkaSourceOptions

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._broker: BrokerView | None = None
        self._available_now: Offsets | None = None
        self._published: Offsets | None = None
        self._seen_latest: Offsets | None = None  # latestOffset's look-up, for the report
        self._triggered_at = time.monotonic()  # the last batch planned (minOffsetsPerTrigger)

    @property
    def broker(self) -> BrokerView:
        if self._broker is None:
            self._broker = BrokerView(self.options)
        return self._broker

    def initialOffset(self) -> dict[str, Any]:
        """Driver. Where the query's first batch starts, with the topics' ids."""
        initial = self.broker.initial()
        return SourceOffset(initial, self.broker.topic_ids(t for t, _ in initial)).to_spark()

    # mypy sees the stand-in classes (core/spark_api.py); PySpark 4.2+ names its own.
    def getDefaultReadLimit(self) -> ReadLimit:  # type: ignore[override]
        limit = self.options.max_offsets_per_trigger
        return ReadMaxRows(limit) if limit else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = self._latest_now()

    # PySpark 4.0-4.1's base method takes no arguments (their reader: LegacyKafkaStreamReader);
    # 4.2+'s limit is its own ReadLimit (above).
    def latestOffset(  # type: ignore[override]
        self, start: dict[str, Any], limit: ReadLimit
    ) -> dict[str, Any]:
        """Driver. The end of the next batch: what is there now, under the read limit.

        Partitions that appeared, or whose log went back (failOnDataLoss decides),
        start at their log start; where each starts is written into the offsets,
        so a replay plans the same ranges without asking the brokers again.
        """
        previous = SourceOffset.from_spark(start)
        self._publish(previous.ends)  # Spark plans the next batch only after this one completed
        if self._available_now is not None:
            latest = self._available_now
        else:
            latest = self._seen_latest = self._latest_now()
        ids = {**previous.topic_ids, **self.broker.topic_ids(t for t, _ in latest)}
        starts = self._restarts(previous, latest, ids)
        begin = {**previous.ends, **starts}
        latest = {tp: max(offset, begin.get(tp, offset)) for tp, offset in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = limit_offsets(begin, latest, limit.max_rows)
        for tp, offset in previous.ends.items():  # a partition no longer listed keeps its position
            latest.setdefault(tp, offset)
        if latest == previous.ends and not starts and ids == previous.topic_ids:
            return start  # nothing new: the same offsets, so Spark runs no batch
        if self._waits_for_more(begin, latest):
            return start
        self._triggered_at = time.monotonic()
        return SourceOffset(latest, ids, starts, self._split()).to_spark()

    def _waits_for_more(self, begin: Offsets, latest: Offsets) -> bool:
        """``minOffsetsPerTrigger``: fewer new offsets than that wait for more, up to
        ``maxTriggerDelay`` since the last batch this reader planned (or its start), as
        Spark's source does; never under Trigger.AvailableNow, which reads what is
        there."""
        least = self.options.min_offsets_per_trigger
        if not least or self._available_now is not None:
            return False
        backlog = sum(max(0, end - begin.get(tp, end)) for tp, end in latest.items())
        waited_ms = (time.monotonic() - self._triggered_at) * 1000
        return backlog < least and waited_ms < self.options.max_trigger_delay_ms

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """Driver, right after :meth:`latestOffset` (for the progress report): the end it
        looked up then, instead of asking the brokers again."""
        seen, self._seen_latest = self._seen_latest, None
        return to_spark(seen if seen is not None else self._latest_now())

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """Driver. The tasks of the batch from ``start`` to ``end``, the same on every replay:
        split as the batch's own offset says (:class:`Split`), whatever the options say now."""
        following = SourceOffset.from_spark(end)
        begin = SourceOffset.from_spark(start).begin_of_next(following)
        unplaced = [tp for tp in following.ends if tp not in begin]
        if unplaced:  # offsets written before starts were checkpointed
            begin = {**begin, **self.broker.earliest(unplaced)}
        split = following.split or self._unrecorded_split()
        ranges = plan_ranges(
            begin, following.ends, split.min_partitions, split.max_records_per_partition
        )
        return pack_ranges(ranges, split.max_partitions, split.planner)

    def _split(self) -> Split:
        options = self.options
        return Split(
            options.min_partitions,
            options.max_partitions,
            options.max_records_per_partition,
            PLANNER,
        )

    def _unrecorded_split(self) -> Split:
        """An offset written before splits were recorded: today's options, which is right
        unless they changed since that batch was planned (said once in the log)."""
        log.warning(
            "eos_kafka: this batch's offset does not record how it was split into tasks "
            "(written by an older version); planning it with today's minPartitions/"
            "maxPartitions. If they changed since it first ran, a sink that marks progress "
            "per task partition may write part of it twice or skip part of it."
        )
        return replace(self._split(), planner=1)  # and with 0.2's packing

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Task: the partition's records (:func:`read_partition`)."""
        from eos_connectors.sources.kafka.fetch import read_partition  # pyarrow: tasks only

        return read_partition(self.options, partition)

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
        from eos_connectors.sources.kafka.lag import publish_offsets

        publish_offsets(self.options, offsets)
        self._published = dict(offsets)

    def stop(self) -> None:
        self._broker = None

    def _latest_now(self) -> Offsets:
        return self.broker.latest(self.broker.partitions())

    def _restarts(self, previous: SourceOffset, latest: Offsets, ids: dict[str, str]) -> Offsets:
        """Where partitions that appeared or went back start, checked.

        A partition that appears after the query started should begin at offset 0
        (Spark's own source reads it so too); a later log start means records
        were deleted before anyone read them. A recreated topic (its id changed,
        or unknown) is read from its log start; a log truncated under the same
        topic id goes on from its new end, as Spark's source does: the records
        below it were read already, and reading them again would duplicate them.
        """
        back = moved_back(previous, latest, ids)
        new = [tp for tp in latest if tp not in previous.ends]
        self._report_gone(previous, latest)
        if not back and not new:
            return {}
        earliest = self.broker.earliest([tp for tp, m in back.items() if not m.same_topic] + new)
        starts = {}
        for tp, moved in back.items():
            if moved.same_topic:
                why = (
                    f"{moved.why}; offsets {latest[tp]}..{previous.ends[tp] - 1} of the log "
                    f"the query read are gone, and records written at offsets it had read "
                    f"are skipped"
                )
                starts[tp] = report_data_loss(self.options, why, resume=latest[tp])
            else:
                starts[tp] = report_data_loss(self.options, moved.why, resume=earliest[tp])
        for topic, partition in new:
            first = earliest[(topic, partition)]
            if first > 0:
                report_data_loss(
                    self.options,
                    f"{topic}-{partition} appeared after the query started, and its log starts "
                    f"at offset {first}: offsets 0..{first - 1} were deleted before they were read",
                    resume=first,
                )
            starts[(topic, partition)] = first
        log.info("eos_kafka: reading %s from %s", sorted(starts), starts)
        return starts

    def _report_gone(self, previous: SourceOffset, latest: Offsets) -> None:
        """Partitions of the checkpoint whose topic no longer exists (deleted): a data loss
        (records not yet read may have gone with it), whose position is kept."""
        missing = sorted(tp for tp in previous.ends if tp not in latest)
        gone = self.broker.missing_topics({t for t, _ in missing}) if missing else set()
        ranges = [f"{t}-{p} from offset {previous.ends[(t, p)]}" for t, p in missing if t in gone]
        if ranges:
            report_data_loss(
                self.options,
                f"topic(s) {', '.join(sorted(gone))} no longer exist (deleted): "
                f"{', '.join(ranges)} on can no longer be read",
                resume=0,
            )


class LegacyKafkaStreamReader(KafkaStreamReader):
    """Driver. The reader on PySpark 4.0-4.1, whose Spark calls ``latestOffset()`` with
    neither the batch's start nor a read limit.

    The start of the next batch is the end of the last one Spark planned: Spark plans
    the checkpoint's last batch again (``partitions``) before it asks a restarted query
    for anything, and a new query starts at :meth:`initialOffset`. With that start the
    reader plans exactly as on 4.2+, applying the read limits itself when
    ``legacyReadLimits`` is set (the options are refused otherwise:
    :func:`check_for_stream`).
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        super().__init__(options)
        self._initial: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None  # where the batch Spark plans next starts

    def initialOffset(self) -> dict[str, Any]:
        """Driver. Asked once: Spark asks after the first ``latestOffset()`` too."""
        if self._initial is None:
            self._initial = super().initialOffset()
        return self._initial

    def latestOffset(self) -> dict[str, Any]:  # type: ignore[override]
        """Driver. The end of the next batch, under the read limit the options give."""
        start = self._last if self._last is not None else self.initialOffset()
        offset = super().latestOffset(start, self._limit())
        self._last = offset
        return offset

    def _limit(self) -> ReadLimit:
        most = self.options.max_offsets_per_trigger
        return ReadMaxRows(most) if most and self.options.legacy_read_limits else ReadAllAvailable()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """Driver. As on 4.2+; and the next batch starts at ``end``. A batch planned from a
        start other than Spark's (never seen) fails here rather than read records again."""
        following = SourceOffset.from_spark(end)
        begin = SourceOffset.from_spark(start).begin_of_next(following)
        behind = sorted(tp for tp, last in following.ends.items() if last < begin.get(tp, last))
        if behind:
            raise EosError(
                f"eos_kafka: batch planned to end before its start for {behind} on PySpark "
                f"{release()} (a restart that did not replan its last batch first). Restart "
                "the query; nothing of this batch was read."
            )
        self._last = end
        return super().partitions(start, end)


def stream_reader(options: KafkaSourceOptions) -> KafkaStreamReader:
    """Driver. The reader for the running PySpark (:mod:`eos_connectors.core.spark_api`)."""
    return KafkaStreamReader(options) if HAS_READ_LIMITS else LegacyKafkaStreamReader(options)
