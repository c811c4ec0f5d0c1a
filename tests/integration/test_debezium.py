"""Debezium change events, in the JSON converter's format (with and without its schema
wrapper, tombstones after deletes), read by eos_kafka and applied to PostgreSQL: the
table ends as the source table would.

The events are generated here in Debezium's documented format (the PostgreSQL
connector's ``before``/``after``/``op``/``source.lsn`` envelope); the real connector on
Kafka Connect costs a Connect worker's start-up and a logical-replication PostgreSQL,
see docs/change-streams.md."""

from __future__ import annotations

import json
import random

import psycopg
import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sources.kafka.debezium import debezium_changes

pytestmark = [pytest.mark.services, pytest.mark.spark]

ROW = "id INT, name STRING, balance BIGINT"


def _event(
    op: str,
    before: dict[str, object] | None,
    after: dict[str, object] | None,
    lsn: int,
    wrapped: bool,
) -> bytes:
    payload = {
        "before": before,
        "after": after,
        "source": {
            "version": "3.6.1.Final",
            "connector": "postgresql",
            "name": "app",
            "ts_ms": 1_767_225_600_000 + lsn,
            "snapshot": "false",
            "db": "app",
            "schema": "public",
            "table": "customers",
            "txId": 700 + lsn,
            "lsn": 24_000_000 + lsn,
        },
        "op": op,
        "ts_ms": 1_767_225_600_100 + lsn,
        "transaction": None,
    }
    if wrapped:  # the schema part is what Connect writes; the reader ignores it
        return json.dumps(
            {"schema": {"type": "struct", "optional": False}, "payload": payload}
        ).encode()
    return json.dumps(payload).encode()


def _produce_history(bootstrap: str, topic: str) -> dict[int, tuple[str, int]]:
    """A snapshot, then inserts, updates, deletes (each followed by its tombstone) and
    re-inserts of 25 customers; returns the source table at the end."""
    rng = random.Random(11)
    table: dict[int, tuple[str, int]] = {}
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for lsn in range(600):
        key = rng.randrange(25)
        before = (
            {"id": key, "name": table[key][0], "balance": table[key][1]} if key in table else None
        )
        if before is not None and rng.random() < 0.25:
            op, after = "d", None
            before = {"id": key, "name": None, "balance": None}  # replica identity: the key
            del table[key]
        else:
            op = ("r" if lsn < 20 else "c") if before is None else "u"
            table[key] = (f"customer-{key}-{lsn}", rng.randrange(10_000))
            after = {"id": key, "name": table[key][0], "balance": table[key][1]}
        message_key = json.dumps({"id": key}).encode()
        producer.produce(topic, key=message_key, value=_event(op, before, after, lsn, lsn % 2 == 0))
        if op == "d":
            producer.produce(topic, key=message_key, value=None)
    producer.flush(30)
    return table


def test_debezium_events_keep_a_table_in_step(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    topic, target = f"dbz-{unique}", f"dbz_{unique}"
    create_topic(endpoints.kafka_bootstrap, topic, partitions=3)
    source_table = _produce_history(endpoints.kafka_bootstrap, topic)
    events = (
        spark.read.format("eos_kafka")
        .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
        .option("subscribe", topic)
        .load()
    )
    changes = debezium_changes(events, ROW)
    assert changes.columns == [
        "id",
        "name",
        "balance",
        "op",
        "lsn",
        "source_ts_ms",
        "topic",
        "partition",
        "offset",
    ]
    (
        changes.drop("topic", "source_ts_ms", "lsn")
        .write.format("eos_postgres")
        .option("dsn", endpoints.postgres_dsn)
        .option("table", target)
        .option("createTable", "true")
        .option("mode", "upsert")
        .option("keyColumns", "id")
        .option("deleteColumn", "op")
        .option("deleteValue", "d")
        .option("orderColumns", "partition,offset")
        .option("sinkId", f"dbz-{unique}")
        .option("txnVersion", "1")
        .mode("append")
        .save()
    )
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(f'SELECT id, name, balance FROM "{target}"').fetchall()
    assert {r[0]: (r[1], r[2]) for r in rows} == source_table
    assert 5 < len(source_table) < 25, "the history must leave some customers deleted"
