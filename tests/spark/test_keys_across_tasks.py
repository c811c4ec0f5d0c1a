"""One key's rows in several tasks of one batch (issue 52, item 1): PostgreSQL and Redis
refuse the batch within seconds, write nothing and leave nothing prepared, and the fix
their message names (a repartition by the key) applies on restart without changing the
batch's recorded source split. Item 2: packed pieces of a partition are read in offset
order; item 3: the Kafka sink writes a task's rows in orderColumns order."""

from __future__ import annotations

import json
import time
from pathlib import Path

import psycopg
import pytest
import redis
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from tests.kafka_sink_util import read_written
from tests.kafka_util import produce_plain
from tests.source_util import stream_of

pytestmark = [pytest.mark.services, pytest.mark.spark]

FIELDS = ["id", "v", "op"]


def _changes() -> list[dict[str, str]]:
    """Key 1 created first and deleted last, key 2 updated at both ends, 200 others
    between: with ``minPartitions=2`` each key's two changes land in two tasks."""
    middle = [{"id": f"o{i}", "v": f"o{i}", "op": "c"} for i in range(200)]
    first = [{"id": "1", "v": "a", "op": "c"}, {"id": "2", "v": "old", "op": "u"}]
    last = [{"id": "2", "v": "new", "op": "u"}, {"id": "1", "v": "", "op": "d"}]
    return first + middle + last


def _parsed(df: DataFrame) -> DataFrame:
    fields = [f"get_json_object(CAST(value AS STRING), '$.{f}') AS {f}" for f in FIELDS]
    return df.selectExpr(*fields, "partition", "offset")


def _run(df: DataFrame, checkpoint: Path, options: dict[str, str], fmt: str) -> None:
    query = (
        df.writeStream.format(fmt)
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)


class Target:
    """Where one test's rows go, and what is there: a PostgreSQL table or Redis keys."""

    def __init__(self, fmt: str, endpoints: Endpoints, name: str) -> None:
        self.fmt, self.endpoints, self.name = fmt, endpoints, name

    def options(self, key: str, value: str) -> dict[str, str]:
        if self.fmt == "eos_postgres":
            return {
                "dsn": self.endpoints.postgres_dsn,
                "table": self.name,
                "mode": "upsert",
                "keyColumns": key,
                "createTable": "true",
                "sinkId": self.name,
            }
        return {
            "url": self.endpoints.redis_url,
            "keyColumn": key,
            "valueColumns": value,
            "mode": "upsert",
            "keyPrefix": f"{self.name}:",
            "sinkId": self.name,
        }

    def rows(self) -> dict[str, str]:
        if self.fmt == "eos_postgres":
            with psycopg.connect(self.endpoints.postgres_dsn) as conn:
                found = conn.execute("SELECT to_regclass(%s)", (self.name,)).fetchone()
                if found == (None,):
                    return {}
                return {str(k): str(v) for k, v in conn.execute(f'SELECT * FROM "{self.name}"')}
        client = redis.Redis.from_url(self.endpoints.redis_url, decode_responses=True)
        try:
            keys = list(client.scan_iter(f"{self.name}:*", count=1000))
            return {k.removeprefix(f"{self.name}:"): str(client.get(k)) for k in keys}
        finally:
            client.close()

    def units_left(self) -> list[str]:
        if self.fmt == "eos_postgres":
            with psycopg.connect(self.endpoints.postgres_dsn) as conn:
                rows = conn.execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
                    (f"eos|{self.name}|",),
                ).fetchall()
            return [str(r[0]) for r in rows]
        client = redis.Redis.from_url(self.endpoints.redis_url, decode_responses=True)
        try:
            return sorted(str(u) for u in client.smembers(f"eos:{{{self.name}}}:units"))
        finally:
            client.close()


SINKS = ["eos_postgres", "eos_redis"]


@pytest.mark.cost(6)
@pytest.mark.parametrize("fmt", SINKS)
def test_a_change_stream_whose_keys_cross_tasks_is_refused_then_applies_after_a_repartition(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path, fmt: str
) -> None:
    """On 0.2 PostgreSQL's query succeeded with row 1 still in the table (its delete ran in
    a task that could not see the other task's prepared insert), or, for key 2, waited
    60 s on a prepared row lock and failed every replay the same way; Redis applied the
    tasks' units in task order, whatever the order of the changes."""
    topic, name = f"split-{unique}", f"split_{unique}_{fmt[4:]}"
    create_topic(endpoints.kafka, topic, partitions=1)
    produce_plain(endpoints.kafka_bootstrap, topic, [json.dumps(c).encode() for c in _changes()])
    target = Target(fmt, endpoints, name)
    changes = {"deleteColumn": "op", "deleteValue": "d", "orderColumns": "partition,offset"}
    options = target.options("id", "v") | changes
    split = stream_of(
        spark, endpoints, subscribe=topic, startingOffsets="earliest", minPartitions="2"
    )
    checkpoint = tmp_path / "checkpoint"
    began = time.monotonic()
    with pytest.raises(StreamingQueryException) as refused:
        _run(_parsed(split), checkpoint, options, fmt)
    took = time.monotonic() - began
    message = str(refused.value)
    assert "reached two tasks" in message and "partitions 0 and 1" in message, message
    assert "1'" in message or "2'" in message, message
    assert ".repartition('id')" in message, message
    assert took < 40, f"refused after {took:.0f} s: the 60 s lock_timeout decided, not the claim"
    assert target.rows() == {}, "a refused batch wrote rows"
    assert target.units_left() == [], "a refused batch left units"

    _run(_parsed(split).repartition("id"), checkpoint, options, fmt)
    expected = {f"o{i}": f"o{i}" for i in range(200)} | {"2": "new"}
    assert target.rows() == expected


@pytest.mark.cost(6)
@pytest.mark.parametrize("fmt", SINKS)
def test_a_batch_upsert_without_order_whose_keys_cross_tasks_is_refused(
    spark: SparkSession, endpoints: Endpoints, unique: str, fmt: str
) -> None:
    """A round-robin shuffle spreads each key over both tasks; with no orderColumns there
    is no order to apply, so the job is refused and writes nothing."""
    target = Target(fmt, endpoints, f"rr_{unique}_{fmt[4:]}")
    rows = [(f"k{i % 10}", str(i)) for i in range(100)]
    df = spark.createDataFrame(rows, "id string, n string").repartition(2)
    options = target.options("id", "n") | {"txnVersion": "1"}
    with pytest.raises(Exception, match="reached two tasks") as refused:
        df.write.format(fmt).options(**options).mode("append").save()
    assert "repartition('id')" in str(refused.value)
    assert target.rows() == {}, "a refused job wrote rows"
    assert target.units_left() == [], "a refused job left units"


@pytest.mark.cost(8)
def test_packed_pieces_of_a_partition_are_read_in_offset_order(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """Issue 52, item 2: ``maxRecordsPerPartition=40, maxPartitions=1`` makes three pieces
    of one partition in one task; 0.2 read [66,100) first, so an upsert without
    orderColumns kept ``k`` = ``old`` (offset 10) over ``new`` (offset 90)."""
    topic = f"packed-{unique}"
    create_topic(endpoints.kafka, topic, partitions=1)
    values = [{"id": f"o{i}", "v": f"o{i}", "op": "c"} for i in range(100)]
    values[10] = {"id": "k", "v": "old", "op": "c"}
    values[90] = {"id": "k", "v": "new", "op": "u"}
    produce_plain(endpoints.kafka_bootstrap, topic, [json.dumps(v).encode() for v in values])
    target = Target("eos_postgres", endpoints, f"packed_{unique}")
    packed = stream_of(
        spark,
        endpoints,
        subscribe=topic,
        startingOffsets="earliest",
        maxRecordsPerPartition="40",
        maxPartitions="1",
    )
    _run(
        _parsed(packed).select("id", "v"),
        tmp_path / "checkpoint",
        target.options("id", "v"),
        target.fmt,
    )
    assert target.rows()["k"] == "new"
    assert len(target.rows()) == 99


@pytest.mark.cost(8)
def test_the_kafka_sink_writes_one_keys_changes_in_order_columns_order(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    """Issue 52, item 3: after a shuffle a task's rows come in any order (here newest
    first: a batch job, since a stream cannot sort); with orderColumns=partition,offset
    the sink writes each key's changes in source order, so compaction keeps the
    latest. 0.2 refused orderColumns."""
    topic, out = f"ord-in-{unique}", f"ord-out-{unique}"
    create_topic(endpoints.kafka, topic, partitions=1)
    create_topic(endpoints.kafka, out, partitions=1, **{"cleanup.policy": "compact"})
    values = [{"id": f"o{i}", "v": f"o{i}", "op": "c"} for i in range(100)]
    values[10] = {"id": "k", "v": "old", "op": "c"}
    values[90] = {"id": "k", "v": "new", "op": "u"}
    produce_plain(endpoints.kafka_bootstrap, topic, [json.dumps(v).encode() for v in values])
    source = spark.read.format("eos_kafka").options(
        **{"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "subscribe": topic}
    )
    shuffled = (
        _parsed(source.load())
        .repartition(1, "id")
        .sortWithinPartitions(F.desc("offset"))
        .selectExpr("id AS key", "v AS value", "partition", "offset")
    )
    options = {
        "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
        "topic": out,
        "orderColumns": "partition,offset",
        "sinkId": f"ord-{unique}",
        "txnVersion": "1",
    }
    shuffled.write.format("eos_kafka").options(**options).mode("append").save()
    written = read_written(endpoints.kafka, out)
    assert [r.value for r in written if r.key == b"k"] == [b"old", b"new"]
    assert [r.value for r in written] == [v["v"].encode() for v in values]
