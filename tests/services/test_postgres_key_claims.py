"""PostgreSQL's key claims against the real server: a task's keys are claimed in one copy;
a key another partition of the batch claimed refuses the later task, naming the key and
both partitions; an earlier attempt of the same partition, or a task of another query
run, is no refusal. Cost: ~1 s."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import psycopg
import pytest
from psycopg import sql

from eos_connectors.core.changes import KeyAcrossTasksError
from eos_connectors.core.protocol import UnitId
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.postgres import key_claims
from eos_connectors.sinks.postgres.options import parse_options

pytestmark = pytest.mark.services

STAGE = sql.Identifier("stage")


@pytest.fixture
def schema(endpoints: Endpoints, unique: str) -> Iterator[str]:
    name = f"claims_{unique}"
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        key_claims.create_table(conn, name)
        yield name
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(name)))


def _claim(dsn: str, schema: str, unit: UnitId, words: list[str]) -> None:
    """One task: its rows staged in its own transaction, their keys claimed on a side
    connection, as the sink's prepare does."""
    with psycopg.connect(dsn) as task, psycopg.connect(dsn, autocommit=True) as side:
        cur = task.cursor()
        cur.execute("CREATE TEMP TABLE stage (word text, n int) ON COMMIT DROP")
        cur.executemany("INSERT INTO stage VALUES (%s, 1)", [(w,) for w in words])
        key_claims.claim(cur, side, schema, STAGE, ["word"], unit)
        task.rollback()


def _unit(batch: int, partition: int, attempt: int = 1, run: str = "0123456789ab") -> UnitId:
    return UnitId("sink-claims", batch, partition, f"{attempt}-{run}-q")


def _claims(dsn: str, schema: str) -> int:
    with psycopg.connect(dsn) as conn:
        table = sql.Identifier(schema, key_claims.TABLE)
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(table)).fetchone()
        return int(row[0]) if row else 0


def test_a_key_of_two_partitions_is_refused_and_a_retry_or_a_new_run_is_not(
    endpoints: Endpoints, schema: str
) -> None:
    dsn = endpoints.postgres_dsn
    _claim(dsn, schema, _unit(7, 0), ["a", "b", "b"])
    _claim(dsn, schema, _unit(7, 1), ["c"])
    assert _claims(dsn, schema) == 3, "one claim a distinct key"

    with pytest.raises(KeyAcrossTasksError) as refused:
        _claim(dsn, schema, _unit(7, 1, attempt=2), ["d", "b"])
    message = str(refused.value)
    assert "word='b'" in message and "0" in message and "1" in message, message
    assert ".repartition(" in message, message

    _claim(dsn, schema, _unit(7, 0, attempt=3), ["a", "b"])  # partition 0's own retry
    _claim(dsn, schema, _unit(7, 1, run="ba9876543210"), ["a", "b"])  # a replay's new run
    _claim(dsn, schema, _unit(8, 1), ["a", "b"])  # the next batch

    # The driver's commit leaves the forget to a thread of its own; a store it cannot
    # reach fails that forget alone, quietly (the next one deletes these claims too).
    options = parse_options(
        {
            "dsn": dsn,
            "table": "t",
            "mode": "upsert",
            "keyColumns": "word",
            "bookkeepingSchema": schema,
        }
    )
    unreachable = replace(options, dsn="host=127.0.0.1 port=1 user=eos connect_timeout=1")
    key_claims.forget_later(unreachable, "sink-claims", 7)
    key_claims.forget_later(options, "sink-claims", 6)
    key_claims.forget_later(options, "sink-claims", 7)
    assert key_claims.forgotten(timeout=30)
    assert _claims(dsn, schema) == 2, "batch 8's claims stay"
