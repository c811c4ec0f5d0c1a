"""A source task's fetches are sized to its range (real broker, librdkafka's own statistics)."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer

from eos_connectors.core.errors import DataLossError
from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sources.kafka import fetch
from eos_connectors.sources.kafka.offsets import KafkaRange
from eos_connectors.sources.kafka.options import KafkaSourceOptions, parse_options
from tests.kafka_util import add_partitions, produce_mixed, produce_plain

pytestmark = pytest.mark.services

RECORDS = 60_000
VALUE_BYTES = 200  # random, so compression cannot shrink the fetch: ~12 MB in the partition
RECEIVED: list[int] = []  # librdkafka's rxmsgs, each time it reported them


def _fill(bootstrap: str, topic: str) -> None:
    create_topic(plaintext(bootstrap), topic)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    value = os.urandom(VALUE_BYTES)
    for i in range(RECORDS):
        producer.produce(topic, value=value, key=b"%d" % i)
        if i % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)


class _Counted(Consumer):  # type: ignore[misc]
    """A source consumer that serves librdkafka's statistics before going back to its pool."""

    def unassign(self) -> None:
        time.sleep(0.1)  # two statistics intervals after the last fetch
        self.consume(1, 0)  # serves the queued statistics callbacks
        super().unassign()


def _received(stats: str) -> None:
    topics = json.loads(stats)["topics"]
    RECEIVED.extend(
        partition["rxmsgs"]
        for topic in topics.values()
        for partition in topic["partitions"].values()
        if partition["partition"] >= 0
    )


def test_a_small_range_fetches_little_past_its_end(
    endpoints: Endpoints, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1,000-record range of a 60,000-record partition: librdkafka receives a few
    thousand records, not the 16 MiB (all 60,000) the fixed fetch size asked for."""
    topic = f"src-fetch-{unique}"
    _fill(endpoints.kafka_bootstrap, topic)
    options = parse_options(
        {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "assign": json.dumps({topic: [0]})}
    )
    configured = fetch._consumer_config

    def with_statistics(options: Any, work: KafkaRange) -> dict[str, Any]:
        return {**configured(options, work), "statistics.interval.ms": 50, "stats_cb": _received}

    monkeypatch.setattr(fetch, "_consumer_config", with_statistics)
    monkeypatch.setattr(fetch, "Consumer", _Counted)
    RECEIVED.clear()
    work = KafkaRange(topic, 0, 20_000, 21_000)
    batches = list(fetch.read_range(options, work, fetch.ConsumerPool()))
    offsets = [o for batch in batches for o in batch.column("offset").to_pylist()]
    assert offsets == list(range(20_000, 21_000))
    assert RECEIVED, "librdkafka reported no statistics"
    # 1 MiB (the smallest fetch) holds ~5,000 of these records; a producer batch is whole.
    assert 1_000 <= max(RECEIVED) <= 15_000, RECEIVED


def _two_partitions_of_ten(bootstrap: str, topic: str) -> KafkaSourceOptions:
    """``topic`` with 10 records in each of its 2 partitions; source options reading it."""
    create_topic(plaintext(bootstrap), topic, 2)
    produce_plain(bootstrap, topic, [b"a%d" % i for i in range(10)], partition=0)
    produce_plain(bootstrap, topic, [b"b%d" % i for i in range(10)], partition=1)
    return parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})


def _offsets(options: Any, work: KafkaRange, pool: fetch.ConsumerPool) -> list[int]:
    batches = fetch.read_range(options, work, pool)
    return [o for batch in batches for o in batch.column("offset").to_pylist()]


def test_a_pooled_consumer_reads_on_where_the_log_ended_and_is_dropped_after_an_error(
    endpoints: Endpoints, unique: str
) -> None:
    """One worker's consumer serves range after range: a range that ended at the log's
    end (librdkafka queues an end-of-partition event there) and the next one from that
    offset once more records came, another partition, a range of another size; a read
    that fails (records gone) closes it, and the next task gets a new one. Ranges of
    up to 16 records share a consumer; up to 4, another (fetch sizes differ)."""
    bootstrap = endpoints.kafka_bootstrap
    topic = f"src-pool-{unique}"
    options = _two_partitions_of_ten(bootstrap, topic)
    pool = fetch.ConsumerPool()
    assert _offsets(options, KafkaRange(topic, 0, 0, 10), pool) == list(range(10))
    time.sleep(0.5)  # the fetcher reaches the log's end meanwhile
    produce_plain(bootstrap, topic, [b"c%d" % i for i in range(10)], partition=0)
    assert _offsets(options, KafkaRange(topic, 0, 10, 20), pool) == list(range(10, 20))
    assert _offsets(options, KafkaRange(topic, 1, 0, 10), pool) == list(range(10))
    assert _offsets(options, KafkaRange(topic, 0, 12, 15), pool) == [12, 13, 14]
    assert pool.created == 2, "one consumer per fetch size"
    with pytest.raises(DataLossError, match=r"before the planned end 30"):
        _offsets(options, KafkaRange(topic, 0, 15, 30), pool)
    assert _offsets(options, KafkaRange(topic, 0, 0, 16), pool) == list(range(16))
    assert pool.created == 3, "the consumer of the failed read was closed, not pooled"


def test_a_read_to_the_logs_end_holds_up_no_next_task(endpoints: Endpoints, unique: str) -> None:
    """A range that ends at the log's end leaves a fetch at the broker that finds no new
    records; the broker holds it up to fetch.wait.max.ms, and the next task's offsets
    call on the pooled consumer waited behind it on the same connection (~500 ms with
    librdkafka's default, every batch of a stream that keeps up with its input)."""
    topic = f"src-log-end-{unique}"
    options = _two_partitions_of_ten(endpoints.kafka_bootstrap, topic)
    pool = fetch.ConsumerPool()
    waits = []
    for _ in range(5):
        assert _offsets(options, KafkaRange(topic, 0, 0, 10), pool) == list(range(10))
        next_task = KafkaRange(topic, 1, 0, 10)
        settings = fetch._consumer_config(options, next_task)
        consumer = pool.take(settings)
        began = time.perf_counter()
        assert fetch._checked_start(consumer, options, next_task) == 0
        waits.append(time.perf_counter() - began)
        pool.give_back(settings, consumer)
    assert pool.created == 1
    assert sorted(waits)[2] < 0.1, waits


@pytest.mark.parametrize("time_type", ["CreateTime", "LogAppendTime"])
def test_every_column_is_what_a_plain_consumer_reads(
    endpoints: Endpoints, unique: str, time_type: str
) -> None:
    """The Arrow columns, built without a call per record where the offsets run without a
    gap, against confluent-kafka's own messages: plain records (no gaps), a committed
    and an aborted transaction between them (gaps: markers, aborted records), records
    with and without a key, both timestamp types."""
    bootstrap = endpoints.kafka_bootstrap
    topic = f"src-columns-{time_type.lower()}-{unique}"
    create_topic(plaintext(bootstrap), topic, 1, **{"message.timestamp.type": time_type})
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(50):
        key = None if i % 7 == 0 else b"k%d" % i
        plain.produce(topic, value=b"v%d" % i, key=key, timestamp=1_700_000_000_000 + i)
    plain.flush(30)
    produce_mixed(bootstrap, topic, 1, transactions=3, per_txn=20, txn_id=f"columns-{unique}")
    end = 50 + 3 * 20 + 3 + 3  # + a marker per transaction, + 3 plain records
    options = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    batches = list(fetch.read_range(options, KafkaRange(topic, 0, 0, end), fetch.ConsumerPool()))
    columns = {
        name: [v for batch in batches for v in batch.column(name).to_pylist()]
        for name in ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType")
    }
    expected = read_to_end(plaintext(bootstrap), topic, ranges={0: (0, end)})
    assert columns["offset"] == [r.offset for r in expected]
    assert columns["offset"][:50] == list(range(50))
    assert len(expected) == 50 + 2 * 20 + 3, "aborted records and markers are gaps"
    assert columns["key"] == [r.key for r in expected]
    assert columns["value"] == [r.value for r in expected]
    assert set(columns["topic"]) == {topic} and set(columns["partition"]) == {0}
    stamps = [r.timestamp for r in expected]
    assert [int(t.timestamp() * 1000) for t in columns["timestamp"]] == stamps
    spark_type = 0 if time_type == "CreateTime" else 1
    assert columns["timestampType"] == [spark_type] * len(expected)
    if time_type == "CreateTime":
        assert stamps[:50] == [1_700_000_000_000 + i for i in range(50)]


def test_a_pooled_consumer_reads_a_partition_added_after_it_last_read(
    endpoints: Endpoints, unique: str
) -> None:
    """A worker's pooled consumer learned the topic's partitions when it read it last; a
    partition added since was unknown to it, and its offsets call waited for librdkafka's
    next metadata refresh (5 minutes by default), up to kafkaConsumer.pollTimeoutMs (2
    minutes): a stream stalled that long after its topic grew, whenever the new
    partition's first task went to a worker that had read the topic before. The task
    asks for the topic's metadata first."""
    bootstrap = endpoints.kafka_bootstrap
    topic = f"src-grown-{unique}"
    create_topic(endpoints.kafka, topic, 1)
    produce_plain(bootstrap, topic, [b"a%d" % i for i in range(10)], partition=0)
    options = parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    pool = fetch.ConsumerPool()
    assert _offsets(options, KafkaRange(topic, 0, 0, 10), pool) == list(range(10))
    add_partitions(bootstrap, topic, 2)
    produce_plain(bootstrap, topic, [b"b%d" % i for i in range(10)], partition=1)
    began = time.monotonic()
    assert _offsets(options, KafkaRange(topic, 1, 0, 10), pool) == list(range(10))
    assert pool.created == 1, "the pooled consumer read the new partition"
    assert time.monotonic() - began < 10, "the read waited for a metadata refresh"
