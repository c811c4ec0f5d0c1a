"""The services are real: Kafka transactions, PostgreSQL two-phase commit, Redis AOF."""

from __future__ import annotations

import psycopg
import pytest
import redis
from confluent_kafka import Producer

from eos_connectors.core.topics import create_topic, end_offsets, read_to_end
from eos_connectors.dev.endpoints import Endpoints

pytestmark = pytest.mark.services


def test_kafka_transactions_commit_and_abort(endpoints: Endpoints, unique: str) -> None:
    topic = f"smoke-{unique}"
    create_topic(endpoints.kafka, topic)
    producer = Producer(
        {"bootstrap.servers": endpoints.kafka_bootstrap, "transactional.id": f"smoke-{unique}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.flush(30)
    producer.abort_transaction(30)
    # Two records and two transaction markers: the log ends at offset 4.
    assert end_offsets(endpoints.kafka, topic) == {0: 4}
    committed = read_to_end(endpoints.kafka, topic, "read_committed")
    uncommitted = read_to_end(endpoints.kafka, topic, "read_uncommitted")
    assert [r.value for r in committed] == [b"committed"]
    assert sorted(r.value for r in uncommitted) == [b"aborted", b"committed"]


def _prepared_ids(conn: psycopg.Connection[tuple[object, ...]], prefix: str) -> list[str]:
    rows = conn.execute(
        "SELECT gid FROM pg_prepared_xacts WHERE gid LIKE %s", (prefix + "%",)
    ).fetchall()
    return [str(row[0]) for row in rows]


def test_postgres_prepared_transactions(endpoints: Endpoints, unique: str) -> None:
    table = f"smoke_{unique}"
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as admin:
        setting = admin.execute("SHOW max_prepared_transactions").fetchone()
        assert setting is not None and int(setting[0]) >= 64
        admin.execute(f"CREATE TABLE {table} (v text)")
        for value in ("commit", "rollback"):
            with psycopg.connect(endpoints.postgres_dsn) as conn:
                conn.execute(f"INSERT INTO {table} VALUES (%s)", (value,))
                conn.execute(f"PREPARE TRANSACTION 'smoke-{unique}-{value}'")
        assert sorted(_prepared_ids(admin, f"smoke-{unique}")) == [
            f"smoke-{unique}-commit",
            f"smoke-{unique}-rollback",
        ]
        # Prepared rows are invisible until COMMIT PREPARED.
        assert admin.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
        admin.execute(f"COMMIT PREPARED 'smoke-{unique}-commit'")
        admin.execute(f"ROLLBACK PREPARED 'smoke-{unique}-rollback'")
        rows = admin.execute(f"SELECT v FROM {table}").fetchall()
        assert rows == [("commit",)]
        assert _prepared_ids(admin, f"smoke-{unique}") == []
        admin.execute(f"DROP TABLE {table}")


def test_redis_persists_with_aof(endpoints: Endpoints, unique: str) -> None:
    client = redis.Redis.from_url(endpoints.redis_url)
    try:
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        persistence = client.info("persistence")
        assert persistence["aof_enabled"] == 1
        client.set(f"smoke:{unique}", "1")
        assert client.get(f"smoke:{unique}") == b"1"
        client.delete(f"smoke:{unique}")
    finally:
        client.close()
