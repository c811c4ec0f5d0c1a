"""The task side of the source: read one offset range into Arrow record batches.

A range ends where the consumer's *position* reaches ``end``: under
read_committed the log has gaps (transaction markers, aborted records,
compacted keys), so counting records would read too few or too many.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Generator, Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from eos_connectors.core import faults, timing
from eos_connectors.core.context import current_batch
from eos_connectors.core.errors import ServiceUnavailableError
from eos_connectors.core.kafka_config import logged
from eos_connectors.core.kafka_errors import BROKER_GONE, QUIET_IDLE_CLOSE, leader_moving
from eos_connectors.core.memory import trim_after
from eos_connectors.core.secrets import settings_digest
from eos_connectors.sources.kafka.data_loss import report_data_loss
from eos_connectors.sources.kafka.offsets import KafkaRange, KafkaRanges
from eos_connectors.sources.kafka.options import KafkaSourceOptions

log = logging.getLogger(__name__)

CONSUME_BATCH = 20_000
# consume(n, timeout) returns when it holds n messages or the timeout ends. Asking for
# no more than the range's remaining offsets returns as soon as the last record is in
# (exact without gaps); with gaps (transaction markers) the short timeout bounds the
# wait. A 0.5 s timeout cost every task half a second at its range's end.
POLL_SECONDS = 0.05

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    return pa.schema(fields)


def read_partition(options: KafkaSourceOptions, partition: object) -> Iterator[pa.RecordBatch]:
    """Task: a planned partition's records: its range, or each packed range's in turn
    (``maxPartitions``); nothing for the placeholder Spark plans when a batch read has
    no range at all."""
    if isinstance(partition, KafkaRanges):
        return chain.from_iterable(read_range(options, r) for r in partition.ranges)
    if isinstance(partition, KafkaRange):
        return read_range(options, partition)
    return iter(())


def read_range(
    options: KafkaSourceOptions, work: KafkaRange, pool: ConsumerPool | None = None
) -> Iterator[pa.RecordBatch]:
    """Task: yield the records of ``work`` as Arrow batches, stopping on the consumer's
    position. The consumer comes from the worker's pool and goes back to it after a
    read to the range's end; after anything else (an error, data skipped, Spark
    stopping early) it is closed."""
    pool = pool or CONSUMERS
    steps = timing.TaskSteps("source read", current_batch(), rest="other")
    settings = _consumer_config(options, work)
    consumer = pool.take(settings)
    whole = False
    try:
        start = _checked_start(consumer, options, work)
        steps.add("client set-up", steps.began)
        if start >= work.end:
            whole = True
            return
        consumer.assign([TopicPartition(work.topic, work.partition, start)])
        schema = arrow_schema(options.include_headers)
        whole = yield from _consume(consumer, options, work, start, schema, steps)
    finally:
        since = time.perf_counter()
        if whole:
            pool.give_back(settings, consumer)
        else:
            consumer.close()
        since = steps.add("client close", since)
        if trim_after(work.size):  # the fetched batches' memory, freed by now
            steps.add("memory trim", since)
        steps.record()


class ConsumerPool:
    """Task side: one Python worker's idle source consumers, by client settings, kept
    across tasks and batches (Spark reuses workers; module state lives with them).

    A new consumer costs a broker connection, and on a SASL listener an authentication
    (~30 ms on the local broker against ~0.5 ms for the offsets call of a pooled one).
    A task takes a consumer out (so two tasks never share one), assigns its partition
    at the range's start (which drops anything fetched for an earlier assignment), and
    gives it back unassigned after reading to the range's end; after anything else it
    is closed. At most ``size`` stay idle, the least recently used closed first.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._idle: OrderedDict[str, list[Consumer]] = OrderedDict()
        self.created = 0  # for tests

    def take(self, settings: dict[str, Any]) -> Consumer:
        """An idle consumer of these settings, or a new one; its group id is the settings'
        ``group.id`` (``kafka.group.id``, as given) or, without one, ``group.id.prefix``
        plus a random suffix. The source never commits to it: it assigns partitions."""
        idle = self._idle.get(settings_digest(settings))
        if idle:
            return idle.pop()
        self.created += 1
        config = {k: v for k, v in settings.items() if k != "group.id.prefix"}
        if "group.id" not in config:
            config["group.id"] = f"{settings['group.id.prefix']}-{uuid.uuid4().hex}"
        return Consumer(logged(config))

    def give_back(self, settings: dict[str, Any], consumer: Consumer) -> None:
        try:
            consumer.unassign()
        except KafkaException:  # not fit to pool
            consumer.close()
            return
        key = settings_digest(settings)
        self._idle.setdefault(key, []).append(consumer)
        self._idle.move_to_end(key)
        while sum(map(len, self._idle.values())) > self.size:
            oldest = next(iter(self._idle))
            self._idle[oldest].pop(0).close()
            if not self._idle[oldest]:
                del self._idle[oldest]


#: This Python worker's pool.
CONSUMERS = ConsumerPool()


# A task reads one known range, start to end, so its fetches are sized to the range.
# A fixed 16 MiB fetch made librdkafka decompress and parse up to ten times the
# records a task uses (measured with librdkafka's statistics: a 2,500-record range
# received 230,000). Measured on 250,000-record partitions of ~100-byte records,
# mean of 10 ranges (`eos bench compare`'s data, lz4): a 25,000-record range 158 ->
# 64 ms, a whole partition unchanged (~750 ms).
# - max.partition.fetch.bytes: FETCH_BYTES_PER_RECORD per record of the range (its count
#   rounded up to a power of two, so similar ranges share a pooled consumer), between
#   64 KiB and 16 MiB. 16 bytes is what a compressed ~100-byte record takes; larger
#   records take a few more fetches, which librdkafka pipelines. The broker returns at
#   least one whole producer batch, however small this is.
# - queued.min.messages: librdkafka prefetches until its queue holds this many records
#   (100,000 by default): the range's size (rounded up) is all a task will use.
# - fetch.queue.backoff.ms: after a fetch filled the queue, librdkafka waits this long
#   (1 s by default) before the next fetch; a range that runs past the fetched records
#   stalled for up to a second. 10 ms is a short recheck.
# - fetch.wait.max.ms: how long the broker holds a fetch that finds no new records
#   (500 ms by default). A range's records are all in the log before it is read, so
#   waiting for more never helps; but a range that ends at the log's end left such a
#   fetch in flight, and the next task on the pooled consumer queued its offsets call
#   behind it on the same connection: 270-520 ms of "client set-up" for every task
#   that read on from the log's end (a stream keeping up with its input does so every
#   batch), against 1-2 ms otherwise. Unassigned, a pooled consumer fetches nothing.
# kafka.* options given by the user win.
FETCH_BYTES_PER_RECORD = 16
MIN_FETCH_BYTES = 64 * 1024
MAX_FETCH_BYTES = 16 * 1024 * 1024
FETCH_QUEUE_BACKOFF_MS = 10
FETCH_WAIT_MAX_MS = 10


def fetch_config(work: KafkaRange) -> dict[str, str]:
    """librdkafka's fetch settings for reading ``work`` and not much past it: sized to
    the range's record count rounded up to a power of two, so that ranges of about
    the same size share pooled consumers."""
    records = 1 << max(0, work.end - work.start - 1).bit_length()
    partition_bytes = min(MAX_FETCH_BYTES, max(MIN_FETCH_BYTES, records * FETCH_BYTES_PER_RECORD))
    return {
        "max.partition.fetch.bytes": str(partition_bytes),
        "fetch.max.bytes": str(64 * 1024 * 1024),  # a task fetches one partition
        "queued.min.messages": str(min(records, 10_000_000)),
        "fetch.queue.backoff.ms": str(FETCH_QUEUE_BACKOFF_MS),
        "fetch.wait.max.ms": str(FETCH_WAIT_MAX_MS),
    }


def _consumer_config(options: KafkaSourceOptions, work: KafkaRange) -> dict[str, Any]:
    return {
        **fetch_config(work),
        **QUIET_IDLE_CLOSE,  # the consumer is pooled
        **options.client_config(),
        **(
            {"group.id": options.group_id}
            if options.group_id
            else {"group.id.prefix": options.group_id_prefix}  # the pool adds a suffix
        ),
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
    }


def _checked_start(consumer: Consumer, options: KafkaSourceOptions, work: KafkaRange) -> int:
    """The offset to start from, applying failOnDataLoss when ``work.start`` is gone."""
    low = _log_start(consumer, options, work)
    if work.start >= low:
        return work.start
    return report_data_loss(
        options,
        f"{work.topic}-{work.partition}: offsets {work.start}..{low - 1} were deleted "
        f"(log start is now {low}) before they were read",
        resume=low,
    )


def _log_start(consumer: Consumer, options: KafkaSourceOptions, work: KafkaRange) -> int:
    """Task: the partition's first offset. A leader that is moving or a broker that went
    (one of a replicated cluster died) or another retriable error is asked again, backing off,
    within kafkaConsumer.pollTimeoutMs; the error says why it gave up.

    A partition the consumer does not know (added to the topic since this pooled consumer
    last read it: librdkafka would learn of it only at its next metadata refresh, five
    minutes by default) makes it ask for the topic's metadata before it asks again."""
    tp = TopicPartition(work.topic, work.partition)
    deadline = time.monotonic() + options.poll_timeout_ms / 1000
    backoff = 0.05
    while True:
        try:
            wait = max(0.1, deadline - time.monotonic())
            low, _high = consumer.get_watermark_offsets(tp, timeout=wait)
            return int(low)
        except KafkaException as exc:
            error = exc.args[0]
            again = leader_moving(exc) or error.retriable() or error.code() in BROKER_GONE
            if not again or time.monotonic() > deadline:
                raise ServiceUnavailableError(
                    f"Kafka at {options.bootstrap_servers} did not return the offsets of "
                    f"{work.topic}-{work.partition} within {options.poll_timeout_ms} ms "
                    f"(kafkaConsumer.pollTimeoutMs): {error.str()}"
                ) from exc
            log.info("eos_kafka: %s-%d: %s; asking again", work.topic, work.partition, error)
            if error.code() == KafkaError._UNKNOWN_PARTITION:
                _learn_partitions(consumer, work.topic, deadline)
        time.sleep(backoff)
        backoff = min(2 * backoff, 1.0)


def _learn_partitions(consumer: Consumer, topic: str, deadline: float) -> None:
    """Task: ask the brokers for ``topic``'s metadata (librdkafka keeps what they answer);
    a failed request is left to the caller's next attempt."""
    try:
        consumer.list_topics(topic, timeout=max(0.1, min(5.0, deadline - time.monotonic())))
    except KafkaException as exc:
        log.info("eos_kafka: %s: metadata not answered (%s); asking again", topic, exc)


def _consume(
    consumer: Consumer,
    options: KafkaSourceOptions,
    work: KafkaRange,
    start: int,
    schema: pa.Schema,
    steps: timing.TaskSteps,
) -> Generator[pa.RecordBatch, None, bool]:
    """The range's records; returns False when the rest of it is gone (failOnDataLoss
    false), True when read to its end."""
    tp = [TopicPartition(work.topic, work.partition)]
    position = start
    last_progress = time.monotonic()
    while position < work.end:
        since = time.perf_counter()
        messages = consumer.consume(min(CONSUME_BATCH, work.end - position), POLL_SECONDS)
        since = steps.add("fetch", since)
        records, gone = _split_events(messages, options, work)
        records = _below(records, work.end)
        if records:
            faults.point("source-read", role="worker")
            batch = _to_arrow(records, work, schema)
            since = steps.add("to Arrow", since)
            yield batch
            steps.add("Spark takes the batch", since)
        if gone:
            return False
        now_at = _offset(consumer.position(tp)[0].offset)  # negative until the first fetch
        if now_at > position:
            position, last_progress = now_at, time.monotonic()
        if time.monotonic() - last_progress > options.poll_timeout_ms / 1000:
            raise ServiceUnavailableError(
                f"No progress reading {work.topic}-{work.partition} at offset {position} "
                f"(range ends at {work.end}) for {options.poll_timeout_ms} ms "
                "(kafkaConsumer.pollTimeoutMs). Is the broker reachable?"
            )
    return True


def _split_events(
    messages: Sequence[Message], options: KafkaSourceOptions, work: KafkaRange
) -> tuple[Sequence[Message], bool]:
    """Separate records from events; True when the rest of the range is gone from the log.

    An end of partition before ``work.end`` (the planned end was the last stable
    offset, which never moves back) or an offset out of range means records were
    deleted or the topic was recreated: failOnDataLoss decides.
    """
    if not messages or (messages[-1].error() is None and messages[0].error() is None):
        return messages, False
    records = []
    for message in messages:
        error = message.error()
        if error is None:
            records.append(message)
        elif error.code() == KafkaError._PARTITION_EOF:
            if _offset(message.offset()) < work.end:
                where = f"ends at {message.offset()}, before the planned end {work.end}"
                report_data_loss(options, f"{work.topic}-{work.partition} {where}", work.end)
                return records, True
        elif error.code() == KafkaError.OFFSET_OUT_OF_RANGE:
            what = f"{work.topic}-{work.partition}: offset out of range"
            report_data_loss(options, what, work.end)
            return records, True
        elif error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
            continue  # the group's coordinator, looked up by librdkafka: never used here
        elif error.fatal() or not error.retriable():
            raise ServiceUnavailableError(
                f"Reading {work.topic}-{work.partition} failed: {error.str()}"
            )
    return records, False


def _offset(value: int | None) -> int:
    return -1 if value is None else int(value)


def _below(records: Sequence[Message], end: int) -> Sequence[Message]:
    """Drop records at or past ``end`` (the next batch's); records arrive in offset order."""
    if not records or _offset(records[-1].offset()) < end:
        return records
    cut = len(records)
    while cut and _offset(records[cut - 1].offset()) >= end:
        cut -= 1
    return records[:cut]


def _to_arrow(records: Sequence[Message], work: KafkaRange, schema: pa.Schema) -> pa.RecordBatch:
    """Columns from the messages with C-level loops: ``map`` over unbound methods, and
    numpy's ``fromiter`` for the numbers (``zip(*pairs)`` built a 25,000-argument call
    and sometimes ran a GC; ``itemgetter`` lists of the timestamp pairs took a third
    more time than one flat ``fromiter``)."""
    count = len(records)
    # (type, milliseconds) pairs, flattened: type, ms, type, ms, ...
    stamps = np.fromiter(
        chain.from_iterable(map(Message.timestamp, records)), np.int64, count=2 * count
    )
    columns: list[pa.Array] = [
        pa.array(list(map(Message.key, records)), pa.binary()),
        pa.array(list(map(Message.value, records)), pa.binary()),
        pa.repeat(pa.scalar(work.topic, pa.string()), count),
        pa.repeat(pa.scalar(work.partition, pa.int32()), count),
        pa.array(_offsets(records), pa.int64()),
        pa.array(stamps[1::2])
        .cast(pa.timestamp("ms", tz="UTC"))
        .cast(schema.field("timestamp").type),
        # librdkafka: 0 none, 1 create, 2 log-append; Spark: -1, 0, 1.
        pa.array((stamps[0::2] - 1).astype(np.int32)),
    ]
    if len(schema) == 8:
        headers = [h or [] for h in map(Message.headers, records)]
        columns.append(pa.array(headers, HEADER_TYPE))
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def _offsets(records: Sequence[Message]) -> np.ndarray:
    """The records' offsets. They increase within a partition, so when the last is
    ``count - 1`` past the first there is no gap and they are a range: no call per
    record. Gaps (transaction markers, compaction) take the offsets one by one."""
    count = len(records)
    first, last = _offset(records[0].offset()), _offset(records[-1].offset())
    if last - first == count - 1:
        return np.arange(first, last + 1, dtype=np.int64)
    return np.fromiter(map(Message.offset, records), np.int64, count=count)
