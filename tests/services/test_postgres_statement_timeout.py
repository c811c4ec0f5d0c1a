"""``statementTimeoutMs`` bounds the server's work on a task's rows, never Spark's: a task
whose rows come slower than the option is written, and a statement the server runs for
longer than it fails the task naming the option. ~7 s."""

from __future__ import annotations

import time
from collections.abc import Iterator

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.protocol import TwoPhaseCommitWriter
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.postgres.rows import StatementTimeoutError
from eos_connectors.testing import CONTRACT_SCHEMA
from tests.upsert_util import upsert_source, upserted

pytestmark = pytest.mark.services

#: The option's floor: the tests' rows take longer than it to come.
TIMEOUT_MS = "1000"
_ONE = pa.RecordBatch.from_pydict({"word": ["a"], "n": [1]})


def _write(endpoints: Endpoints, name: str, guarantee: str, rows: Iterator[pa.RecordBatch]) -> None:
    """One task of ``rows`` written and, exactly once, committed, as Spark would."""
    source = upsert_source(
        "postgres", endpoints, name, deliveryGuarantee=guarantee, statementTimeoutMs=TIMEOUT_MS
    )
    writer = source.streamWriter(CONTRACT_SCHEMA, False)
    try:
        if isinstance(writer, TwoPhaseCommitWriter):
            task = TaskIdentity(f"query-{name}", "q", "run", 0, 0, 1)
            writer.commit([writer.prepare_task(task, rows)], 0)
        else:
            writer.commit([writer.write(rows)], 0)
    finally:
        close = getattr(writer, "close", None)
        if close is not None:
            close()


def _slowly(words: int, gap_s: float) -> Iterator[pa.RecordBatch]:
    """One row a batch, ``gap_s`` apart: an upstream stage Spark takes its time with."""
    for i in range(words):
        yield pa.RecordBatch.from_pydict({"word": [f"w{i}"], "n": [i]})
        time.sleep(gap_s)


@pytest.mark.parametrize("guarantee", ["exactly-once", "at-least-once"])
def test_rows_that_come_slower_than_the_statement_timeout_are_written(
    endpoints: Endpoints, unique: str, guarantee: str
) -> None:
    """Four batches 0.6 s apart under a 1 s timeout. The COPY runs while Spark computes the
    rows; it counted Spark's time against the server's ``statement_timeout``, and every
    try failed with the server's bare "canceling statement due to statement timeout"
    (with the 5-minute default: any task whose rows took longer to come)."""
    name = f"slow_{guarantee[0]}_{unique}"
    _write(endpoints, name, guarantee, _slowly(4, 0.6))
    assert upserted("postgres", endpoints, name) == {f"w{i}": i for i in range(4)}


def test_a_statement_the_server_runs_too_long_names_the_option(
    endpoints: Endpoints, unique: str
) -> None:
    """A trigger on the target makes the upsert's INSERT run 1.5 s: the task fails naming
    ``statementTimeoutMs`` and the table, and writes nothing."""
    name = f"slow_apply_{unique}"
    with pytest.raises(StatementTimeoutError):  # the table is made by the first write
        _write(endpoints, name, "exactly-once", _with_slow_trigger(endpoints, name))
    with pytest.raises(
        StatementTimeoutError,
        match=rf"{name} \(option table\) ran longer than statementTimeoutMs = {TIMEOUT_MS}",
    ):
        _write(
            endpoints,
            name,
            "exactly-once",
            iter([pa.RecordBatch.from_pydict({"word": ["a"], "n": [1]})]),
        )
    assert upserted("postgres", endpoints, name) == {}


def _with_slow_trigger(endpoints: Endpoints, table: str) -> Iterator[pa.RecordBatch]:
    """The task's one row, after a trigger that sleeps 1.5 s was put on ``table`` (which
    the writer's start created)."""
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE OR REPLACE FUNCTION eos_test_sleep() RETURNS trigger LANGUAGE plpgsql "
            "AS $$ BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$"
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER slow BEFORE INSERT ON {} FOR EACH STATEMENT "
                "EXECUTE FUNCTION eos_test_sleep()"
            ).format(sql.Identifier(table))
        )
    yield _ONE
