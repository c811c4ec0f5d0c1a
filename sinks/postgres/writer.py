"""The PostgreSQL unit store: prepared transactions, a decision table, COPY."""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Iterator
from typing import Any

import psycopg
import pyarrow as pa
from psycopg import sql
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from connectors.errors import ServiceUnavailableError
from connectors.protocol import Decision, Outcome, TwoPhaseCommitWriter, UnitId
from connectors.secrets import redact_url
from sinks.postgres import copy
from sinks.postgres.options import PostgresSinkOptions

log = logging.getLogger(__name__)

Connection = psycopg.Connection[tuple[Any, ...]]

LOCK_TIMEOUT = "60s"


def connect(options: PostgresSinkOptions, autocommit: bool = True) -> Connection:
    """A connection, or a ServiceUnavailableError that never shows the password."""
    try:
        return psycopg.connect(options.dsn, autocommit=autocommit, connect_timeout=15)
    except psycopg.OperationalError as exc:
        raise ServiceUnavailableError(
            f"PostgreSQL at {redact_url(options.dsn)} (option 'dsn') is unreachable: "
            f"{_first_line(exc)}"
        ) from None


def _first_line(exc: Exception) -> str:
    return redact_url(str(exc).strip().splitlines()[0]) if str(exc).strip() else type(exc).__name__


class _Rows:
    """Writing one task's rows in the sink's mode; shared by both delivery guarantees."""

    def __init__(self, options: PostgresSinkOptions, columns: tuple[str, ...]) -> None:
        self.options = options
        self.columns = columns

    def write(self, cur: psycopg.Cursor[Any], name: str, batches: Iterator[pa.RecordBatch]) -> int:
        cur.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
        if self.options.mode == "append":
            return copy.append(cur, self.options.table, self.columns, batches)
        return copy.upsert(
            cur,
            self.options.table,
            self.options.bookkeeping_schema,
            name,
            self.columns,
            self.options.key_columns,
            batches,
        )


class PostgresTwoPhaseWriter(TwoPhaseCommitWriter):
    """Exactly-once: each task PREPAREs a transaction, the driver COMMITs PREPARED them.

    Guarantee: a batch's rows become visible when the driver commits the batch
    (each task's rows atomically; all of them once the commit or, after a crash,
    the recovery completes), and exactly once through any crash and replay.
    """

    def __init__(self, options: PostgresSinkOptions, columns: tuple[str, ...]) -> None:
        self.options = options
        self.rows = _Rows(options, columns)
        self._conn: Connection | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "rows": self.rows, "_conn": None}

    @property
    def conn(self) -> Connection:
        if self._conn is None or self._conn.closed:
            self._conn = connect(self.options)
        return self._conn

    @property
    def decisions(self) -> sql.Composable:
        return sql.Identifier(self.options.bookkeeping_schema, "decisions")

    # -- UnitStore hooks -----------------------------------------------------------

    def sink_id(self, query_id: str) -> str:
        if self.options.sink_id:
            return self.options.sink_id
        digest = hashlib.sha256(f"{query_id}|{self.options.table_name}".encode()).hexdigest()
        return f"pg-{digest[:16]}"

    def discard_attempts(self, sink_id: str, batch_id: int, partition: int) -> None:
        for unit in self._prepared(UnitId.prefix(sink_id, batch_id, partition)):
            log.info("rolling back %s left by an earlier attempt", unit)
            self.rollback_unit(unit)

    def find_decision(self, sink_id: str, batch_id: int) -> Decision | None:
        row = self.conn.execute(
            sql.SQL("SELECT query_id, units FROM {} WHERE sink_id = %s AND batch_id = %s").format(
                self.decisions
            ),
            (sink_id, batch_id),
        ).fetchone()
        if row is None:
            return None
        units = tuple(u for u in map(UnitId.parse, row[1]) if u is not None)
        return Decision(sink_id, batch_id, str(row[0]), units)

    def prepare(self, unit: UnitId, rows: Iterator[pa.RecordBatch]) -> int:
        conn = connect(self.options, autocommit=False)
        try:  # not `with conn`: its exit would COMMIT, which a two-phase transaction refuses
            conn.tpc_begin(str(unit))
            with conn.cursor() as cur:
                count = self.rows.write(cur, str(unit), rows)
            if count:
                conn.tpc_prepare()
            else:
                conn.tpc_rollback()
        finally:
            conn.close()
        return count

    def record_decision(self, decision: Decision) -> Decision:
        self.conn.execute(
            sql.SQL(
                "INSERT INTO {} (sink_id, batch_id, query_id, units) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (sink_id, batch_id) DO NOTHING"
            ).format(self.decisions),
            (
                decision.sink_id,
                decision.batch_id,
                decision.query_id,
                [str(u) for u in decision.units],
            ),
        )
        recorded = self.find_decision(decision.sink_id, decision.batch_id)
        assert recorded is not None
        return recorded

    def commit_unit(self, unit: UnitId) -> Outcome:
        try:
            self.conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(str(unit))))
        except psycopg.errors.UndefinedObject:
            return Outcome.ALREADY_COMMITTED  # decided units are never rolled back
        except psycopg.OperationalError as exc:
            log.warning("COMMIT PREPARED %s: %s; retrying", unit, _first_line(exc))
            self._conn = None
            return Outcome.RETRY
        return Outcome.COMMITTED

    def rollback_unit(self, unit: UnitId) -> None:
        with contextlib.suppress(psycopg.errors.UndefinedObject):  # gone already: fine
            self.conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(str(unit))))

    def units_in_doubt(self, sink_id: str) -> list[UnitId]:
        return self._prepared(UnitId.prefix(sink_id))

    def prune_decisions(self, sink_id: str, below_batch: int) -> None:
        self.conn.execute(
            sql.SQL("DELETE FROM {} WHERE sink_id = %s AND batch_id < %s").format(self.decisions),
            (sink_id, below_batch),
        )

    def _prepared(self, prefix: str) -> list[UnitId]:
        rows = self.conn.execute(
            "SELECT gid FROM pg_prepared_xacts "
            "WHERE database = current_database() AND starts_with(gid, %s)",
            (prefix,),
        ).fetchall()
        return sorted(u for u in (UnitId.parse(str(r[0])) for r in rows) if u is not None)


class PostgresPlainWriter(DataSourceStreamArrowWriter):
    """At-least-once: each task commits its own transaction; a replayed batch writes again.

    With mode=upsert a replay rewrites the same rows (idempotent in effect); with
    mode=append it duplicates them. For benchmarks and stores that tolerate it.
    """

    def __init__(self, options: PostgresSinkOptions, columns: tuple[str, ...]) -> None:
        self.options = options
        self.rows = _Rows(options, columns)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        name = f"plain|{context.partitionId() if context else 0}"
        with connect(self.options, autocommit=False) as conn, conn.cursor() as cur:
            self.rows.write(cur, name, iterator)
        return WriterCommitMessage()
