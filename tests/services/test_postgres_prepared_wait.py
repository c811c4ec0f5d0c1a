"""Two tasks of one exactly-once batch that write the same key of a unique constraint (an
append with duplicate keys in two tasks): the second waited for the first's prepared
transaction, which commits only after the batch, until the sink's 60 s lock timeout, on
every retry, and then failed saying only "lock timeout". It now fails within seconds,
naming both task partitions and what to do; nothing of the batch is written. A key twice
in one task, or already in the table, is named with the way out. ~3 s."""

from __future__ import annotations

import time

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.errors import BadRecordError
from eos_connectors.core.protocol import TwoPhaseCommitWriter
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.postgres import PostgresDataSource
from eos_connectors.sinks.postgres.waits import PreparedWaitError
from eos_connectors.testing import CONTRACT_SCHEMA

pytestmark = pytest.mark.services


def test_a_key_two_tasks_of_a_batch_append_fails_in_seconds_naming_both(
    endpoints: Endpoints, unique: str
) -> None:
    table = f"dup_{unique}"
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (word text PRIMARY KEY, n bigint)").format(
                sql.Identifier(table)
            )
        )
    options = {"dsn": endpoints.postgres_dsn, "table": table, "sinkId": table, "mode": "append"}
    writer = PostgresDataSource(options).streamWriter(CONTRACT_SCHEMA, False)
    assert isinstance(writer, TwoPhaseCommitWriter)

    def task(partition: int) -> TaskIdentity:
        return TaskIdentity(f"query-{unique}", "q", "run", 0, partition, partition + 1)

    def rows(words: list[str]) -> pa.RecordBatch:
        return pa.RecordBatch.from_pydict({"word": words, "n": [1] * len(words)})

    first = writer.prepare_task(task(0), iter([rows(["a", "b"])]))
    began = time.monotonic()
    with pytest.raises(PreparedWaitError, match=r"Task partition 1 .* task partition 0 "):
        writer.prepare_task(task(1), iter([rows(["c", "b"])]))
    assert time.monotonic() - began < 10, "it waited out the lock timeout"
    writer.abort([first], 0)
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        written = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        assert written.fetchone() == (0,)
    assert writer.units_in_doubt(table) == []
    writer.close()


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_an_appended_key_the_table_refuses_is_named_with_the_way_out(
    endpoints: Endpoints, unique: str, guarantee: str
) -> None:
    table = f"dup1_{guarantee[0]}_{unique}"
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (word text PRIMARY KEY, n bigint)").format(
                sql.Identifier(table)
            )
        )
    options = {"dsn": endpoints.postgres_dsn, "table": table, "sinkId": table, "mode": "append"}
    writer = PostgresDataSource({**options, "deliveryGuarantee": guarantee}).streamWriter(
        CONTRACT_SCHEMA, False
    )
    twice = pa.RecordBatch.from_pydict({"word": ["a", "b", "a"], "n": [1, 2, 3]})
    with pytest.raises(BadRecordError, match=r"\(word\)=\(a\).*mode=upsert and keyColumns"):
        if isinstance(writer, TwoPhaseCommitWriter):
            writer.prepare_task(TaskIdentity(f"q-{unique}", "q", "run", 0, 0, 1), iter([twice]))
        else:
            writer.write(iter([twice]))
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        written = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        assert written.fetchone() == (0,)
