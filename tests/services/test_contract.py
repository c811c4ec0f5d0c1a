"""The contract suite against the real stores: PostgreSQL (append, summed by word) and
Redis (increment counters). Minutes, not Spark restarts: no Spark session runs here."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator, Mapping

import psycopg
import pyarrow as pa
import pytest
import redis
from psycopg import sql

from eos_connectors.core.protocol import TwoPhaseCommitWriter, UnitId
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.postgres import PostgresDataSource
from eos_connectors.sinks.postgres.connection import give_back, take
from eos_connectors.sinks.postgres.exactly_once import PostgresExactlyOnceWriter
from eos_connectors.sinks.redis import RedisDataSource
from eos_connectors.testing import CONTRACT_SCHEMA, SinkContract, rows_of
from eos_connectors.testing.contract import batch_rows

pytestmark = pytest.mark.services


class TestPostgresAppend(SinkContract):
    @pytest.fixture(autouse=True)
    def _target(self, endpoints: Endpoints, unique: str) -> None:
        self.dsn = endpoints.postgres_dsn
        self.table = f"contract_{unique}"

    def new_writer(self, sink_id: str | None = None) -> TwoPhaseCommitWriter:
        options = {"dsn": self.dsn, "table": self.table, "createTable": "true"}
        if sink_id:
            options["sinkId"] = sink_id
        writer = PostgresDataSource(options).streamWriter(CONTRACT_SCHEMA, False)
        assert isinstance(writer, TwoPhaseCommitWriter)
        return writer

    def visible(self) -> Mapping[str, int]:
        with psycopg.connect(self.dsn) as conn:
            rows = conn.execute(
                sql.SQL("SELECT word, sum(n) FROM {} GROUP BY word").format(
                    sql.Identifier(self.table)
                )
            ).fetchall()
        return {str(word): int(total) for word, total in rows}


class TestRedisIncrement(SinkContract):
    @pytest.fixture(autouse=True)
    def _target(self, endpoints: Endpoints, unique: str) -> None:
        self.url = endpoints.redis_url
        self.prefix = f"contract:{unique}:"

    def new_writer(self, sink_id: str | None = None) -> TwoPhaseCommitWriter:
        options = {
            "url": self.url,
            "keyColumn": "word",
            "valueColumns": "n",
            "mode": "increment",
            "keyPrefix": self.prefix,
        }
        if sink_id:
            options["sinkId"] = sink_id
        writer = RedisDataSource(options).streamWriter(CONTRACT_SCHEMA, False)
        assert isinstance(writer, TwoPhaseCommitWriter)
        return writer

    def visible(self) -> Mapping[str, int]:
        client = redis.Redis.from_url(self.url)
        try:
            return {
                key.decode().removeprefix(self.prefix): int(client.get(key) or 0)
                for key in client.scan_iter(f"{self.prefix}*")
            }
        finally:
            client.close()


def test_a_zombies_late_upsert_never_holds_the_next_batchs_rows(
    endpoints: Endpoints, unique: str
) -> None:
    """An upsert prepared after its batch was decided holds row locks; the next batch's
    task releases it before writing instead of waiting out lock_timeout."""
    table = f"contract_upsert_{unique}"
    options = {
        "dsn": endpoints.postgres_dsn,
        "table": table,
        "createTable": "true",
        "mode": "upsert",
        "keyColumns": "word",
    }
    writer = PostgresDataSource(options).streamWriter(CONTRACT_SCHEMA, False)
    assert isinstance(writer, PostgresExactlyOnceWriter)
    suite = _suite("upsert-query", 1)
    suite.run_batch(writer, 0)
    zombie = UnitId(writer.sink_id(suite.query_id), 0, 0, "99-zombie")
    writer.prepare(zombie, iter([rows_of([("w0", 1), ("w1", 1)])]))
    began = time.monotonic()
    suite.run_batch(writer, 1)  # upserts w0 and w1 again
    assert time.monotonic() - began < 10, "the next batch waited on the zombie's row locks"
    assert writer.units_in_doubt(writer.sink_id(suite.query_id)) == []


def test_a_workers_tasks_share_a_connection_and_a_failed_task_closes_its_own(
    endpoints: Endpoints, unique: str
) -> None:
    """The tasks a worker runs check and prepare on the connection the previous task
    gave back, and the driver commits on its own; one the server dropped is replaced;
    a task that fails mid-prepare closes its connection, so its transaction is rolled
    back, nothing of it stays prepared, and the retried task writes its rows once."""
    options = {
        "dsn": endpoints.postgres_dsn,
        "table": f"contract_pool_{unique}",
        "createTable": "true",
    }
    writer = PostgresDataSource(options).streamWriter(CONTRACT_SCHEMA, False)
    assert isinstance(writer, PostgresExactlyOnceWriter)
    suite = _suite(f"pool-query-{unique}", 2)
    suite.dsn, suite.table = endpoints.postgres_dsn, options["table"]
    first = [suite.prepare(writer, 0, 0)]
    pid = _pooled_backend(writer)
    first.append(suite.prepare(writer, 0, 1))
    assert _pooled_backend(writer) == pid, "the second task opened a connection of its own"
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
    writer.commit(first, 0)  # on a new connection: the pooled one no longer answers
    assert _pooled_backend(writer) != pid

    failing = _pooled_backend(writer)
    with pytest.raises(RuntimeError, match="rows ran out"):
        suite.ship(writer).prepare_task(suite.task(1, 0), _failing_rows(batch_rows(1, 0)[0]))
    assert _backend_gone(endpoints.postgres_dsn, failing), "the failed task's session lives on"
    second = [suite.prepare(writer, 1, 0), suite.prepare(writer, 1, 1)]
    writer.commit(second, 1)
    assert writer.units_in_doubt(writer.sink_id(suite.query_id)) == []
    assert dict(suite.visible()) == dict(suite.expected(range(2)))


def _suite(query_id: str, partitions: int) -> TestPostgresAppend:
    suite = TestPostgresAppend()
    suite.query_id, suite.partitions = query_id, partitions
    suite._task_ids, suite._run = itertools.count(1), "run"
    return suite


def _pooled_backend(writer: PostgresExactlyOnceWriter) -> int:
    """The server process of the connection this thread's pool holds for the writer."""
    conn = take(writer.options)
    try:
        return conn.info.backend_pid
    finally:
        give_back(writer.options, conn)


def _failing_rows(batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
    yield batch
    raise RuntimeError("rows ran out: the task failed mid-prepare")


def _backend_gone(dsn: str, pid: int) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(50):
            row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
            if row.fetchone() == (0,):
                return True
            time.sleep(0.1)
    return False
