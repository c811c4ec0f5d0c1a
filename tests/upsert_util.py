"""One upsert target (word -> n) in PostgreSQL or Redis for tests that drive the protocol's
hooks directly: the format's options, and what the store holds."""

from __future__ import annotations

import psycopg
import pyarrow as pa
import redis
from pyspark.sql.datasource import DataSource

from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.protocol import TwoPhaseCommitWriter
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.postgres import PostgresDataSource
from eos_connectors.sinks.redis import RedisDataSource
from eos_connectors.testing import CONTRACT_SCHEMA

STORES = ["postgres", "redis"]


def upsert_source(store: str, endpoints: Endpoints, name: str, **extra: str) -> DataSource:
    """The store's format for an upsert of ``word`` -> ``n`` into table or key prefix
    ``name``, with sink id ``name`` and ``extra`` options."""
    options = {"sinkId": name, "mode": "upsert", **extra}
    if store == "postgres":
        options |= {"dsn": endpoints.postgres_dsn, "table": name}
        options |= {"keyColumns": "word", "createTable": "true"}
        return PostgresDataSource(options)
    options |= {"url": endpoints.redis_url, "keyPrefix": f"{name}:"}
    options |= {"keyColumn": "word", "valueColumns": "n"}
    return RedisDataSource(options)


def upserted(store: str, endpoints: Endpoints, name: str) -> dict[str, int]:
    """Word -> n, as the store holds them now."""
    if store == "postgres":
        with psycopg.connect(endpoints.postgres_dsn) as conn:
            found = conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()
            if found == (None,):
                return {}
            rows = conn.execute(f'SELECT word, n FROM "{name}"').fetchall()
        return {str(w): int(n) for w, n in rows}
    client = redis.Redis.from_url(endpoints.redis_url, decode_responses=True)
    try:
        keys = list(client.scan_iter(f"{name}:*"))
        return {k.removeprefix(f"{name}:"): int(client.get(k) or 0) for k in keys}
    finally:
        client.close()


#: What :func:`write_one_batch` writes: word -> n.
ONE_BATCH = {"a": 1, "b": 2}


def write_one_batch(source: DataSource, query_id: str) -> None:
    """Start ``source``'s streaming writer (its start checks run), then one batch of
    one task of :data:`ONE_BATCH`, prepared and committed as Spark would."""
    writer = source.streamWriter(CONTRACT_SCHEMA, False)
    assert isinstance(writer, TwoPhaseCommitWriter)
    rows = pa.RecordBatch.from_pydict({"word": list(ONE_BATCH), "n": list(ONE_BATCH.values())})
    prepared = writer.prepare_task(TaskIdentity(query_id, "q", "run", 0, 0, 1), iter([rows]))
    writer.commit([prepared], 0)
    writer.close()
