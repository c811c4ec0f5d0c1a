"""``spark.read.format("eos_kafka")`` against the real broker: the committed records
between the read's bounds, each once, as Spark's ``kafka`` batch source reads them."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import spark_partition_id

from eos_connectors.core.topics import Record, create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from tests.kafka_util import produce_mixed, produce_plain

pytestmark = [pytest.mark.services, pytest.mark.spark]


def _read(spark: SparkSession, endpoints: Endpoints, **options: str) -> DataFrame:
    reader = spark.read.format("eos_kafka").option(
        "kafka.bootstrap.servers", endpoints.kafka_bootstrap
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _values(rows: list[Any]) -> list[bytes]:
    return [bytes(r["value"]) for r in rows]


def test_a_batch_read_returns_each_committed_record_once_and_nothing_of_an_open_transaction(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    topic = f"batch-committed-{unique}"
    create_topic(endpoints.kafka, topic, partitions=3)
    visible = produce_mixed(
        endpoints.kafka_bootstrap, topic, 3, transactions=12, per_txn=50, txn_id=unique
    )
    # A transaction left open: under read_committed "latest" is the last stable offset,
    # so the read ends below it, neither waiting for it nor returning its records.
    open_txn = Producer(
        {"bootstrap.servers": endpoints.kafka_bootstrap, "transactional.id": f"{unique}-open"}
    )
    open_txn.init_transactions(30)
    open_txn.begin_transaction()
    for p in range(3):
        open_txn.produce(topic, value=b"in-doubt", partition=p)
    open_txn.flush(30)
    try:
        began = time.monotonic()
        df = _read(spark, endpoints, subscribe=topic, maxPartitions="2")
        rows = df.withColumn("task", spark_partition_id()).collect()
        assert time.monotonic() - began < 60, "the read waited for the open transaction"
    finally:
        open_txn.abort_transaction(30)
    values = _values(rows)
    assert len(values) == len(set(values)), "a record was read twice"
    assert set(values) == visible, "lost, aborted or in-doubt records"
    assert {r["task"] for r in rows} == {0, 1}, "three partitions were not read by two tasks"
    assert [f.name for f in df.schema.fields] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]
    ends = {p: max(r["offset"] for r in rows if r["partition"] == p) + 1 for p in range(3)}
    got = sorted(
        Record(r["partition"], r["offset"], bytes(r["key"]), bytes(r["value"])) for r in rows
    )
    assert got == read_to_end(endpoints.kafka, topic, ranges={p: (0, e) for p, e in ends.items()})


def test_a_batch_read_takes_its_bounds_as_offsets_or_timestamps(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    topic = f"batch-bounds-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    for p in (0, 1):
        produce_plain(
            endpoints.kafka_bootstrap, topic, [f"p{p}-{i}".encode() for i in range(10)], p
        )
    time.sleep(0.05)
    cut = int(time.time() * 1000)
    time.sleep(0.05)
    produce_plain(endpoints.kafka_bootstrap, topic, [b"after-0"], 0)

    def read(**options: str) -> set[bytes]:
        return set(_values(_read(spark, endpoints, subscribe=topic, **options).collect()))

    before = {f"p{p}-{i}".encode() for p in (0, 1) for i in range(10)}
    assert read() == before | {b"after-0"}  # earliest to latest
    bounded = read(
        startingOffsets=json.dumps({topic: {"0": 3, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": 5, "1": -1}}),
    )
    assert bounded == {b"p0-3", b"p0-4"} | {f"p1-{i}".encode() for i in range(10)}
    # ending by timestamp: below the first record at or after it; a partition with none
    # (partition 1 has nothing after the cut) ends at its latest offset, as in Spark
    assert read(endingTimestamp=str(cut)) == before
    # partition 1 has no record after the cut: it starts at its end, as Spark's does
    latest = {"startingOffsetsByTimestampStrategy": "latest"}
    assert read(startingTimestamp=str(cut), **latest) == {b"after-0"}
    per_partition = json.dumps({topic: {"0": cut, "1": cut}})
    assert read(endingOffsetsByTimestamp=per_partition) == before
    assert read(startingOffsets=json.dumps({topic: {"0": 11, "1": 10}})) == set()  # at the end


def test_a_batch_read_refuses_bounds_that_read_nothing_and_a_stream_refuses_an_end(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    topic = f"batch-refused-{unique}"
    create_topic(endpoints.kafka, topic, partitions=1)
    with pytest.raises(Exception, match="'startingOffsets' cannot be latest"):
        _read(spark, endpoints, subscribe=topic, startingOffsets="latest").collect()
    with pytest.raises(Exception, match="'endingOffsets' cannot be earliest"):
        _read(spark, endpoints, subscribe=topic, endingOffsets="earliest").collect()
    produce_plain(endpoints.kafka_bootstrap, topic, [b"a", b"b"], 0)
    with pytest.raises(Exception, match=rf"{topic}-0 starts at 2, after its end 1"):
        _read(
            spark,
            endpoints,
            subscribe=topic,
            startingOffsets=json.dumps({topic: {"0": 2}}),
            endingOffsets=json.dumps({topic: {"0": 1}}),
        ).collect()
    # crossed once resolved: the first record at or after timestamp 1 is offset 0
    with pytest.raises(Exception, match=rf"start is after its end in {topic}-0 from 2 to 0"):
        _read(
            spark,
            endpoints,
            subscribe=topic,
            startingOffsets=json.dumps({topic: {"0": 2}}),
            endingTimestamp="1",
        ).collect()
    stream = (
        spark.readStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
        .option("subscribe", topic)
        .option("endingOffsets", "latest")
        .load()
    )
    with pytest.raises(Exception, match="apply to batch reads"):
        stream.writeStream.format("console").start().awaitTermination(60)
    # A schema of the user's own is refused, as Spark's kafka source refuses it.
    given = (
        spark.read.format("eos_kafka")
        .schema("value string")
        .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
        .option("subscribe", topic)
    )
    with pytest.raises(Exception, match=r"fixed columns .* so \.schema\(\.\.\.\) cannot"):
        given.load().collect()


def test_an_empty_topic_reads_no_row(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    topic = f"batch-empty-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    assert _read(spark, endpoints, subscribe=topic).collect() == []
