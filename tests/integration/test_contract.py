"""The contract suite against the real stores: PostgreSQL (append, summed by word) and
Redis (increment counters). Minutes, not Spark restarts: no Spark session runs here."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping

import psycopg
import pytest
import redis
from psycopg import sql

from connectors.endpoints import Endpoints
from connectors.protocol import TwoPhaseCommitWriter, UnitId
from connectors.testing import CONTRACT_SCHEMA, SinkContract, rows_of
from sinks.postgres import PostgresDataSource
from sinks.postgres.writer import PostgresTwoPhaseWriter
from sinks.redis import RedisDataSource

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
        options = {"url": self.url, "keyColumn": "word", "valueColumns": "n",
                   "mode": "increment", "keyPrefix": self.prefix}  # fmt: skip
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
    options = {"dsn": endpoints.postgres_dsn, "table": table, "createTable": "true",
               "mode": "upsert", "keyColumns": "word"}  # fmt: skip
    writer = PostgresDataSource(options).streamWriter(CONTRACT_SCHEMA, False)
    assert isinstance(writer, PostgresTwoPhaseWriter)
    suite = TestPostgresAppend()
    suite.query_id, suite.partitions = "upsert-query", 1
    suite._task_ids, suite._run = itertools.count(1), "run"
    suite.run_batch(writer, 0)
    zombie = UnitId(writer.sink_id(suite.query_id), 0, 0, "99-zombie")
    writer.prepare(zombie, iter([rows_of([("w0", 1), ("w1", 1)])]))
    began = time.monotonic()
    suite.run_batch(writer, 1)  # upserts w0 and w1 again
    assert time.monotonic() - began < 10, "the next batch waited on the zombie's row locks"
    assert writer.units_in_doubt(writer.sink_id(suite.query_id)) == []
