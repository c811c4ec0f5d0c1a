"""Debezium change events, in the JSON converter's format (with and without its schema
wrapper, tombstones after deletes), read by eos_kafka and applied to PostgreSQL: the
table ends as the source table would.

In CI the events are generated in Debezium's documented format (the PostgreSQL
connector's ``before``/``after``/``op``/``source.lsn`` envelope); `make soak` also runs
Debezium's real PostgreSQL connector on Kafka Connect standalone against the stack's
PostgreSQL (logical decoding): its jars (~41 MB from Maven Central) and worker cost
more than the CI budget spares for what the generated events already cover."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from eos_connectors.core.kafka_config import plaintext
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
    # idempotent, as Kafka Connect's producer is: a retried send (a new topic's leader not
    # ready yet, a loaded machine) must not land after a later event of the same key
    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
    )
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
    assert producer.flush(60) == 0, "the history was not all delivered"
    return table


def test_debezium_events_keep_a_table_in_step(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    topic, target = f"dbz-{unique}", f"dbz_{unique}"
    create_topic(endpoints.kafka, topic, partitions=3)
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


@pytest.mark.soak  # a Kafka Connect worker and ~41 MB of jars: `make soak`, not CI
def test_a_real_debezium_connector_keeps_a_table_in_step(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """Debezium's PostgreSQL connector on Kafka Connect standalone reads the stack's
    PostgreSQL by logical decoding (snapshot, then the stream); eos_kafka reads its topic
    and eos_postgres applies it to another table, which ends equal to the source."""
    from eos_connectors.dev.stack.connect import DebeziumSource, connect_worker

    source, target = f"dbz_src_{unique}", f"dbz_dst_{unique}"
    source_dsn = endpoints.postgres_dsn
    with psycopg.connect(source_dsn, autocommit=True) as conn:
        # In public: the stack's user "eos" has a schema of its own name, where an
        # unqualified name would land.
        conn.execute(
            f"CREATE TABLE public.{source} (id int PRIMARY KEY, name text, balance bigint)"
        )
        for i in range(10):
            conn.execute(f"INSERT INTO public.{source} VALUES (%s, %s, %s)", (i, f"c{i}", i * 10))
        conn.execute(f"CREATE PUBLICATION dbz_{unique} FOR TABLE public.{source}")
    connector = DebeziumSource(source_dsn, (f"public.{source}",), f"dbz{unique}", f"dbz_{unique}")
    topic = f"{connector.prefix}.public.{source}"
    try:
        with connect_worker(endpoints.kafka_bootstrap, connector, tmp_path / "connect.log"):
            _wait_for_records(endpoints.kafka_bootstrap, topic, 10, tmp_path / "connect.log")
            events = 10 + _change_history(source_dsn, f"public.{source}")
            _wait_for_records(endpoints.kafka_bootstrap, topic, events, tmp_path / "connect.log")
    finally:
        _drop_slot(source_dsn, connector.slot)
    frame = (
        spark.read.format("eos_kafka")
        .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
        .option("subscribe", topic)
        .load()
    )
    (
        debezium_changes(frame, ROW)
        .drop("topic", "source_ts_ms", "lsn")
        .write.format("eos_postgres")
        .options(
            dsn=source_dsn,
            table=target,
            createTable="true",
            mode="upsert",
            keyColumns="id",
            deleteColumn="op",
            deleteValue="d",
            orderColumns="partition,offset",
            sinkId=f"dbz-real-{unique}",
            txnVersion="1",
        )
        .mode("append")
        .save()
    )
    with psycopg.connect(source_dsn) as conn:
        wanted = conn.execute(
            f"SELECT id, name, balance FROM public.{source} ORDER BY id"
        ).fetchall()
        got = conn.execute(f'SELECT id, name, balance FROM "{target}" ORDER BY id').fetchall()
    assert got == wanted
    assert 5 < len(wanted) < 25


def _change_history(dsn: str, table: str) -> int:
    """Updates, deletes, re-inserts and inserts, several to one row in one transaction;
    returns how many records Debezium writes for them (a delete: the event and its
    tombstone)."""
    rng = random.Random(5)
    records = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        live = set(range(10))
        for step in range(120):
            key = rng.randrange(20)
            with conn.transaction():
                if key in live and rng.random() < 0.3:
                    conn.execute(f"DELETE FROM {table} WHERE id = %s", (key,))
                    live.discard(key)
                    records += 2
                elif key in live:
                    conn.execute(
                        f"UPDATE {table} SET name = %s, balance = balance + 1 WHERE id = %s",
                        (f"c{key}-{step}", key),
                    )
                    conn.execute(f"UPDATE {table} SET balance = balance * 2 WHERE id = %s", (key,))
                    records += 2
                else:
                    conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s)", (key, f"n{key}", step))
                    live.add(key)
                    records += 1
    return records


def _wait_for_records(bootstrap: str, topic: str, count: int, log: Path) -> None:
    from eos_connectors.core.topics import end_offsets

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if sum(end_offsets(plaintext(bootstrap), topic).values()) >= count:
                return
        except Exception:  # the topic does not exist yet
            pass
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
    raise AssertionError(f"Debezium wrote fewer than {count} records to {topic}:\n{tail}")


def _drop_slot(dsn: str, slot: str) -> None:
    """The connector's replication slot and publication: a slot left behind keeps WAL."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(60):
            active = conn.execute(
                "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)
            ).fetchone()
            if active is None:
                break
            if not active[0]:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
                break
            time.sleep(0.5)
        conn.execute(f"DROP PUBLICATION IF EXISTS {slot}")


@pytest.mark.parametrize(
    "value",
    [b"\x00\x00\x00\x00\x01avro", b"{not json", b'{"id": 3, "name": "c", "balance": 1}'],
    ids=["avro", "broken-json", "unwrapped-row"],
)
def test_a_value_that_is_no_change_event_fails_naming_where_it_is(
    spark: SparkSession, endpoints: Endpoints, unique: str, value: bytes
) -> None:
    """Only a tombstone carries no change: any other value that is no Debezium event (Avro
    bytes, broken JSON, a row ExtractNewRecordState unwrapped) fails the read, naming its
    topic, partition and offset. It used to be dropped, and the query stayed green."""
    from confluent_kafka import Producer

    topic = f"dbz-bad-{unique}"
    create_topic(endpoints.kafka, topic, partitions=1)
    good = {"before": None, "after": {"id": 1, "name": "a", "balance": 5}, "op": "c"}
    producer = Producer({"bootstrap.servers": endpoints.kafka_bootstrap})

    def changes() -> Any:
        events = (
            spark.read.format("eos_kafka")
            .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
            .option("subscribe", topic)
            .load()
        )
        return debezium_changes(events, ROW)

    for record in (json.dumps(good).encode(), None):
        producer.produce(topic, key=b"1", value=record, partition=0)
    assert producer.flush(30) == 0
    assert changes().count() == 1, "the event read, the tombstone dropped"
    producer.produce(topic, key=b"1", value=value, partition=0)
    assert producer.flush(30) == 0
    with pytest.raises(Exception, match=rf"topic {topic} partition 0 offset 2 is not a Debezium"):
        changes().collect()
