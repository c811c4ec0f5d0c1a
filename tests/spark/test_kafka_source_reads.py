"""eos_kafka reads what Spark's kafka source reads: exactly the committed records, the
starting offsets' forms, read limits, packed ranges, offsets published for lag.

Cost: ~25 s in the session's Spark."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from pyspark.sql import SparkSession
from pyspark.sql.functions import spark_partition_id

from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.spark_api import HAS_READ_LIMITS
from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sources.kafka.offsets import SourceOffset
from tests.kafka_util import (
    produce_mixed,
    produce_plain,
)
from tests.source_util import (
    json_field,
    records_of,
    run_available_now,
    run_bounded,
    start_memory,
    stream_of,
    wait_for,
)

pytestmark = [pytest.mark.services, pytest.mark.spark]


def test_reads_exactly_the_committed_records(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic = f"src-committed-{unique}"
    create_topic(endpoints.kafka, topic, partitions=3)
    visible = produce_mixed(
        endpoints.kafka_bootstrap, topic, 3, transactions=12, per_txn=50, txn_id=unique
    )
    df = stream_of(spark, endpoints, subscribe=topic, startingOffsets="earliest")
    rows, progress = run_available_now(df, tmp_path / "ck")
    values = [bytes(r["value"]) for r in rows]
    assert len(values) == len(set(values)), "a record was read twice"
    assert set(values) == visible, "lost or aborted records"
    assert all(r["topic"] == topic for r in rows)

    # The same rows as a plain read_committed confluent-kafka consumer over the same ranges.
    end = json_field(progress[-1]["sources"][0]["endOffset"])[topic]
    ranges = {int(p): (0, int(o)) for p, o in end.items()}
    assert records_of(rows) == read_to_end(endpoints.kafka, topic, ranges=ranges)


def test_max_partitions_packs_the_ranges_into_fewer_tasks_and_reads_each_record_once(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic = f"src-packed-{unique}"
    create_topic(endpoints.kafka, topic, partitions=5)
    visible = produce_mixed(
        endpoints.kafka_bootstrap, topic, 5, transactions=10, per_txn=40, txn_id=unique
    )
    df = stream_of(spark, endpoints, subscribe=topic, startingOffsets="earliest", maxPartitions="2")
    tasks = df.withColumn("task", spark_partition_id())
    rows, progress = run_available_now(tasks, tmp_path / "ck")
    values = [bytes(r["value"]) for r in rows]
    assert len(values) == len(set(values)) and set(values) == visible, "lost or repeated records"
    assert {r["partition"] for r in rows} == set(range(5))
    assert {r["task"] for r in rows} == {0, 1}, "five partitions were not read by two tasks"
    end = json_field(progress[-1]["sources"][0]["endOffset"])[topic]
    ranges = {int(p): (0, int(o)) for p, o in end.items()}
    assert records_of(rows) == read_to_end(endpoints.kafka, topic, ranges=ranges)


@pytest.mark.newer_spark
def test_read_limit_bounds_every_batch(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic = f"src-limit-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    produce_plain(endpoints.kafka_bootstrap, topic, [f"v{i}".encode() for i in range(1000)])
    df = stream_of(
        spark, endpoints, subscribe=topic, startingOffsets="earliest", maxOffsetsPerTrigger="150"
    )
    rows, progress = run_bounded(df, tmp_path / "ck", endpoints.kafka_bootstrap, topic)
    assert len(rows) == 1000
    batches = [p["numInputRows"] for p in progress if p["numInputRows"]]
    assert max(batches) <= 150
    assert len(batches) >= 1000 // 150
    assert sum(batches) == 1000


@pytest.mark.cost(3)
def test_starting_offsets_forms(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic = f"src-start-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    for p in (0, 1):
        produce_plain(
            endpoints.kafka_bootstrap, topic, [f"p{p}-{i}".encode() for i in range(10)], p
        )
    cases = {
        "earliest": {"startingOffsets": "earliest"},
        "json": {"startingOffsets": json.dumps({topic: {"0": 7, "1": -2}})},
        "json-latest": {"startingOffsets": json.dumps({topic: {"0": -1, "1": 9}})},
    }
    first: dict[str, set[bytes]] = {}
    for name, options in cases.items():
        rows, _ = run_available_now(
            stream_of(spark, endpoints, subscribe=topic, **options), tmp_path / name
        )
        first[name] = {bytes(r["value"]) for r in rows}
    assert len(first["earliest"]) == 20
    assert first["json"] == {b"p0-7", b"p0-8", b"p0-9"} | {f"p1-{i}".encode() for i in range(10)}
    assert first["json-latest"] == {b"p1-9"}

    # By timestamp: every record from a moment on.
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    produce_plain(endpoints.kafka_bootstrap, topic, [b"after-0"], 0)
    produce_plain(endpoints.kafka_bootstrap, topic, [b"after-1"], 1)
    rows, _ = run_available_now(
        stream_of(spark, endpoints, subscribe=topic, startingTimestamp=str(cut)), tmp_path / "ts"
    )
    assert {bytes(r["value"]) for r in rows} == {b"after-0", b"after-1"}


def test_latest_reads_only_what_comes_after_the_start(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic = f"src-latest-{unique}"
    create_topic(endpoints.kafka, topic)
    produce_plain(endpoints.kafka_bootstrap, topic, [b"before"])
    name = f"q_{unique}"
    query = start_memory(stream_of(spark, endpoints, subscribe=topic), name, tmp_path / "ck")
    try:
        wait_for(lambda: query.lastProgress is not None, "the first trigger")
        produce_plain(endpoints.kafka_bootstrap, topic, [b"after"])
        wait_for(lambda: spark.table(name).count() >= 1, "the record produced after start")
        query.processAllAvailable()
        assert [bytes(r["value"]) for r in spark.table(name).collect()] == [b"after"]
    finally:
        query.stop()


def test_min_offsets_per_trigger_waits_for_more_up_to_max_trigger_delay(
    endpoints: Endpoints, unique: str
) -> None:
    """Fewer new records than minOffsetsPerTrigger plan no batch until maxTriggerDelay has
    passed since the last batch; enough of them plan one at once; Trigger.AvailableNow
    never waits."""
    from eos_connectors.core.spark_api import ReadAllAvailable
    from eos_connectors.sources.kafka.options import parse_options
    from eos_connectors.sources.kafka.stream_reader import KafkaStreamReader

    bootstrap, topic = endpoints.kafka_bootstrap, f"src-min-{unique}"
    create_topic(plaintext(bootstrap), topic)
    produce_plain(bootstrap, topic, [f"r{i}".encode() for i in range(10)], 0)
    raw = {
        "kafka.bootstrap.servers": bootstrap,
        "subscribe": topic,
        "minOffsetsPerTrigger": "20",
        "maxTriggerDelay": "2s",
    }
    reader = KafkaStreamReader(parse_options(raw))
    start = SourceOffset({(topic, 0): 0}).to_spark()
    assert reader.latestOffset(start, ReadAllAvailable()) == start, "10 < 20: wait"
    time.sleep(2.2)
    assert SourceOffset.from_spark(reader.latestOffset(start, ReadAllAvailable())).ends == {
        (topic, 0): 10
    }, "the delay passed: a batch of what is there"
    ten = SourceOffset({(topic, 0): 10}).to_spark()
    produce_plain(bootstrap, topic, [f"s{i}".encode() for i in range(25)], 0)
    assert SourceOffset.from_spark(reader.latestOffset(ten, ReadAllAvailable())).ends == {
        (topic, 0): 35
    }, "25 >= 20: at once"
    now = KafkaStreamReader(parse_options(raw))
    now.prepareForTriggerAvailableNow()
    assert now.latestOffset(start, ReadAllAvailable()) != start, "AvailableNow reads what is there"


@pytest.mark.newer_spark
def test_offsets_behind_latest_as_sparks_source_reports_them(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """PySpark's Python sources cannot report metrics; the listener computes Spark's three
    lag metrics from each progress: 1,000 records in two partitions read 300 a batch
    leave 350 behind in each after the first batch, none after the last."""
    from eos_connectors.sources.kafka.metrics import OffsetsBehindLatest, offsets_behind_latest

    topic = f"src-lag-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    for p in (0, 1):
        produce_plain(
            endpoints.kafka_bootstrap, topic, [f"p{p}-{i}".encode() for i in range(500)], p
        )
    reported: list[tuple[str, dict[str, float]]] = []
    listener = OffsetsBehindLatest(lambda query, metrics: reported.append((query, metrics)))
    spark.streams.addListener(listener)
    try:
        df = stream_of(
            spark,
            endpoints,
            subscribe=topic,
            startingOffsets="earliest",
            maxOffsetsPerTrigger="300",
        )
        rows, progress = run_bounded(df, tmp_path / "ck", endpoints.kafka_bootstrap, topic)
        found = [offsets_behind_latest(p["sources"][0]) for p in progress]
        every = [m for m in found if m is not None]
        wait_for(lambda: len(reported) >= len(every), "a report of every batch")
    finally:
        spark.streams.removeListener(listener)
    assert len(rows) == 1000
    lags = [m for m, p in zip(found, progress, strict=True) if p["numInputRows"]]
    # PySpark 4.0-4.1 record the source's planned end as the latest: 0 behind (the docs).
    first = 350.0 if HAS_READ_LIMITS else 0.0
    assert lags[0] == {
        "minOffsetsBehindLatest": first,
        "maxOffsetsBehindLatest": first,
        "avgOffsetsBehindLatest": first,
    }
    assert lags[-1] == dict.fromkeys(lags[0], 0.0)
    assert [m for _, m in reported] == every


@pytest.mark.newer_spark
def test_offsets_are_published_to_a_group_for_lag(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    from confluent_kafka import Consumer

    topic, group = f"src-lag-{unique}", f"lag-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    for p in (0, 1):
        produce_plain(endpoints.kafka_bootstrap, topic, [b"x"] * (3 + p), p)
    df = stream_of(
        spark, endpoints, subscribe=topic, startingOffsets="earliest", publishOffsetsToGroup=group
    )
    consumer = Consumer({"bootstrap.servers": endpoints.kafka_bootstrap, "group.id": group})
    partitions = [TopicPartition(topic, 0), TopicPartition(topic, 1)]

    def published() -> list[tuple[int, int]]:
        return [(tp.partition, tp.offset) for tp in consumer.committed(partitions, 30)]

    try:
        if HAS_READ_LIMITS:
            run_available_now(df, tmp_path / "ck")
            assert published() == [(0, 3), (1, 4)]
        else:  # Spark 4.0-4.1 say a batch completed only at the next trigger (the docs)
            query = start_memory(df, f"q_{unique}", tmp_path / "ck", every="200 milliseconds")
            try:
                wait_for(lambda: published() == [(0, 3), (1, 4)], "the batch published")
            finally:
                query.stop()
    finally:
        consumer.close()


def test_bad_option_fails_at_load(spark: SparkSession, endpoints: Endpoints) -> None:
    with pytest.raises(Exception, match="'maxOffsetsPerTrigger' must be a whole number"):
        stream_of(spark, endpoints, subscribe="t", maxOffsetsPerTrigger="many")
