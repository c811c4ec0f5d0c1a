"""The exactly-once PostgreSQL sink: each task prepares a transaction (``PREPARE
TRANSACTION``), the driver records the batch's decision and commits them (``COMMIT
PREPARED``); a PostgreSQL unit store of :mod:`eos_connectors.core.protocol`."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from pyspark.sql.datasource import WriterCommitMessage

from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.errors import EosError
from eos_connectors.core.protocol import (
    Decision,
    Lineage,
    Outcome,
    PreparedUnit,
    Siblings,
    SinkResetError,
    TwoPhaseCommitWriter,
    UnitId,
    UnitMissingError,
)
from eos_connectors.sinks.postgres import key_claims
from eos_connectors.sinks.postgres.connection import (
    Connection,
    allowing,
    first_line,
    give_back,
    server_pid,
    take,
)
from eos_connectors.sinks.postgres.options import PostgresSinkOptions
from eos_connectors.sinks.postgres.rows import ControlTypes, TaskRows
from eos_connectors.sinks.postgres.waits import PreparedWait, PreparedWaitError

if TYPE_CHECKING:
    import pyarrow as pa

    from eos_connectors.sinks.postgres.changes import BeforeApply

log = logging.getLogger(__name__)


class PreparedLimitError(EosError):
    """PostgreSQL refused a task's PREPARE TRANSACTION: ``max_prepared_transactions`` is
    reached (the server's SQLSTATE 53200 for PREPARE, with the limit in its hint)."""

    def __init__(self, unit: UnitId, exc: psycopg.errors.OutOfMemory) -> None:
        said = exc.diag.message_primary or str(exc)
        hint = f" ({exc.diag.message_hint.rstrip('.')})" if exc.diag.message_hint else ""
        super().__init__(
            f"PostgreSQL refused to prepare the transaction of task partition "
            f"{unit.partition} of batch {unit.batch_id}: {said}{hint}. Each sink task of a "
            "batch holds one prepared transaction until the driver commits the batch, and "
            "every exactly-once sink writing to this server shares the limit: set "
            "max_prepared_transactions above the sink tasks per batch (after a shuffle, "
            "spark.sql.shuffle.partitions) times the queries writing at once, and restart "
            "the server; or write from fewer tasks (coalesce() before the sink). Nothing of "
            "the task is visible."
        )


class PostgresExactlyOnceWriter(TwoPhaseCommitWriter):
    """Exactly-once: each task PREPAREs a transaction, the driver COMMITs PREPARED them.

    Guarantee: a batch's rows become visible when the driver commits the batch
    (each task's rows atomically; all of them once the commit or, after a crash,
    the recovery completes), and exactly once through any crash and replay.

    Bookkeeping in ``<bookkeepingSchema>``: ``sinks`` (each sink id's owner query and
    target table), ``decisions`` (one row per decided batch) and ``committed_units``
    (a row each prepared transaction inserts, so it becomes visible exactly when the
    transaction is committed). A per-(sink, batch) advisory
    lock makes the decision exclusive with any rollback of that batch's units.
    """

    #: PREPARE TRANSACTION is atomic, so a listed unit is whole: a task reports another
    #: attempt's unit instead of rolling it back (its row locks would block this one's).
    siblings = Siblings.ADOPT
    connector = "eos_postgres"

    def __init__(
        self,
        options: PostgresSinkOptions,
        columns: tuple[str, ...],
        control_types: ControlTypes = (),
        checkpoint: str | None = None,
    ) -> None:
        self.options = options
        self.rows = TaskRows(options, columns, control_types)
        self.checkpoint_location = checkpoint
        self._conn: Connection | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "rows": self.rows, "_conn": None}

    @property
    def conn(self) -> Connection:
        """Task or driver: the connection this writer took from its thread's pool."""
        if self._conn is None or self._conn.closed:
            self._conn = take(self.options)
        return self._conn

    def prepare_task(self, task: TaskIdentity, rows: Iterator[Any]) -> PreparedUnit:
        """Task: the protocol's prepare, then the connection back to the worker's pool."""
        try:
            return super().prepare_task(task, rows)
        finally:
            self.close()

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: the protocol's commit, then the connection back to the pool."""
        try:
            super().commit(messages, batchId)
        finally:
            self.close()

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: the protocol's abort, then the connection back to the pool."""
        try:
            super().abort(messages, batchId)
        finally:
            self.close()

    def _table(self, name: str) -> sql.Composable:
        return sql.Identifier(self.options.bookkeeping_schema, name)

    # -- UnitStore hooks -----------------------------------------------------------

    def sink_id(self, query_id: str) -> str:
        return self.options.sink_id_for(query_id)

    def owner(self, sink_id: str) -> Lineage | None:
        row = self.conn.execute(
            sql.SQL("SELECT query_id, origin FROM {} WHERE sink_id = %s").format(
                self._table("sinks")
            ),
            (sink_id,),
        ).fetchone()
        return None if row is None else Lineage(str(row[0]), str(row[1]))

    def claim(self, sink_id: str, lineage: Lineage) -> Lineage:
        self.conn.execute(
            sql.SQL(
                "INSERT INTO {} (sink_id, query_id, origin, target) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (sink_id) DO NOTHING"
            ).format(self._table("sinks")),
            (sink_id, lineage.query_id, lineage.origin, self.options.table_name),
        )
        owner = self.owner(sink_id)
        assert owner is not None  # sink rows are deleted only by `eos sinks reset`
        return owner

    def find_decision(self, sink_id: str, batch_id: int) -> Decision | None:
        # The offsets column through the row's JSON: a table made before it (whose owner
        # has not added it: format._add_offsets_column) reads as "", not as an error.
        row = self.conn.execute(
            sql.SQL(
                "SELECT query_id, units, to_jsonb(d) ->> 'offsets' FROM {} d"
                " WHERE sink_id = %s AND batch_id = %s"
            ).format(self._table("decisions")),
            (sink_id, batch_id),
        ).fetchone()
        if row is None:
            return None
        units = tuple(u for u in map(UnitId.parse, row[1]) if u is not None)
        return Decision(sink_id, batch_id, str(row[0]), units, str(row[2] or ""))

    def applied_watermark(self, sink_id: str, query_id: str) -> int:
        """The query's highest decided batch: pruning forgets old decisions, never the newest,
        so a batch below it (a job's ``txnVersion`` used again) still writes nothing."""
        row = self.conn.execute(
            sql.SQL("SELECT max(batch_id) FROM {} WHERE sink_id = %s AND query_id = %s").format(
                self._table("decisions")
            ),
            (sink_id, query_id),
        ).fetchone()
        return -1 if row is None or row[0] is None else int(row[0])

    def prepare(self, unit: UnitId, rows: Iterator[pa.RecordBatch]) -> int:
        """Task: the rows and the unit's commit record in one transaction, then PREPARE
        TRANSACTION (ROLLBACK when there were no rows). In plain SQL rather than psycopg's
        tpc_* calls, which leave the connection unusable until the transaction is
        finished, so the worker's next task can use it. Any error closes the connection:
        the server rolls the open transaction back."""
        conn = self.conn
        side = take(self.options, "claims") if self.options.key_columns else None
        seconds = self.options.statement_seconds
        watch = PreparedWait(self.options, unit, server_pid(conn))
        try:
            with conn.cursor() as cur, allowing(conn, seconds), watch:
                cur.execute("BEGIN")
                count = self.rows.write(cur, str(unit), rows, self._claiming(unit, side))
                cur.execute(
                    sql.SQL("INSERT INTO {} (unit, sink_id, batch_id) VALUES (%s, %s, %s)").format(
                        self._table("committed_units")
                    ),
                    (str(unit), unit.sink_id, unit.batch_id),
                )
                end = sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(str(unit)))
                try:
                    cur.execute(end if count else sql.SQL("ROLLBACK"))
                except psycopg.errors.OutOfMemory as exc:  # PREPARE's own: the limit
                    raise PreparedLimitError(unit, exc) from exc
        except BaseException as exc:
            self._drop()
            if watch.holder is not None:
                raise PreparedWaitError(self.options, unit, watch.holder) from exc
            raise
        finally:
            if side is not None:
                give_back(self.options, side, "claims")
        return count

    def _claiming(self, unit: UnitId, side: Connection | None) -> BeforeApply | None:
        """Task: the key claims of a keyed mode, on ``side`` (:mod:`.key_claims`)."""
        if side is None:
            return None
        schema, keys = self.options.bookkeeping_schema, self.options.key_columns

        def claim(cur: psycopg.Cursor[Any], stage: sql.Identifier) -> None:
            with allowing(side, self.options.statement_seconds):
                key_claims.claim(cur, side, schema, stage, keys, unit)

        return claim

    def decide(self, decision: Decision) -> Decision:
        """Under the sink's lock, shared (``eos sinks reset`` takes it exclusively), and the
        batch's, exclusively: the existing decision, or a new one naming only prepared
        transactions, while the decision's query still owns the sink id."""
        with self.conn.transaction():
            self.conn.execute(
                "SELECT pg_advisory_xact_lock_shared(%s)", (sink_lock_key(decision.sink_id),)
            )
            self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(decision),))
            recorded = self.find_decision(decision.sink_id, decision.batch_id)
            if recorded is not None:
                return recorded
            _check_still_owned(self.owner(decision.sink_id), decision)
            names = [str(u) for u in decision.units]
            prepared = {
                str(r[0])
                for r in self.conn.execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE gid = ANY(%s)", (names,)
                ).fetchall()
            }
            missing = [u for u in decision.units if str(u) not in prepared]
            if missing:
                raise UnitMissingError(decision.batch_id, missing)
            self._insert_decision(decision, names)
        return decision

    def _insert_decision(self, decision: Decision, names: list[str]) -> None:
        """The decision's row, its ``offsets`` only where the table has that column (one
        made before it, which its owner has not altered: format._add_offsets_column):
        the row is built from JSON, whose keys without a column are dropped."""
        values = {
            "sink_id": decision.sink_id,
            "batch_id": decision.batch_id,
            "query_id": decision.query_id,
            "units": names,
            "offsets": decision.offsets or None,
        }
        self.conn.execute(
            sql.SQL(
                "INSERT INTO {0} SELECT * FROM jsonb_populate_record(NULL::{0},"
                " %s::jsonb || jsonb_build_object('decided_at', now()))"
            ).format(self._table("decisions")),
            (json.dumps(values),),
        )

    def commit_unit(self, unit: UnitId) -> Outcome:
        try:
            self.conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(str(unit))))
        except psycopg.errors.UndefinedObject:
            return Outcome.ALREADY_COMMITTED if self._recorded(unit) else Outcome.MISSING
        except psycopg.OperationalError as exc:
            log.warning("COMMIT PREPARED %s: %s; retrying", unit, first_line(exc, self.options))
            self._drop()
            return Outcome.RETRY
        return Outcome.COMMITTED

    def rollback_unit(self, unit: UnitId) -> None:
        with contextlib.suppress(psycopg.errors.UndefinedObject):  # gone already: fine
            self.conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(str(unit))))

    def rollback_undecided(self, sink_id: str, batch_id: int, units: Sequence[UnitId]) -> bool:
        """Under the batch's lock, shared: ROLLBACK PREPARED cannot run inside a transaction,
        so the session holds the lock while it checks and rolls back."""
        key = _lock_key(Decision(sink_id, batch_id, "", ()))
        self.conn.execute("SELECT pg_advisory_lock_shared(%s)", (key,))
        try:
            if self.find_decision(sink_id, batch_id) is not None:
                return False
            for unit in units:
                self.rollback_unit(unit)
            return True
        finally:
            self._unlock_shared(key)

    def _unlock_shared(self, key: int) -> None:
        """A session lock outlives the call: a connection that cannot release it is closed,
        which releases it, so none goes back to the pool holding it."""
        try:
            self.conn.execute("SELECT pg_advisory_unlock_shared(%s)", (key,))
        except BaseException:
            self._drop()
            raise

    def units_in_doubt(self, sink_id: str) -> list[UnitId]:
        rows = self.conn.execute(
            "SELECT gid FROM pg_prepared_xacts "
            "WHERE database = current_database() AND starts_with(gid, %s)",
            (UnitId.prefix(sink_id),),
        ).fetchall()
        return sorted(u for u in (UnitId.parse(str(r[0])) for r in rows) if u is not None)

    def forget_key_claims(self, sink_id: str, up_to_batch: int) -> None:
        key_claims.forget_later(self.options, sink_id, up_to_batch)

    def record_abort(self, sink_id: str, batch_id: int, run: str) -> None:
        self.conn.execute(
            sql.SQL(
                "INSERT INTO {} (sink_id, batch_id, run) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"
            ).format(self._table("aborted_runs")),
            (sink_id, batch_id, run),
        )

    def aborted(self, sink_id: str, batch_id: int, run: str) -> bool:
        row = self.conn.execute(
            sql.SQL("SELECT 1 FROM {} WHERE sink_id = %s AND batch_id = %s AND run = %s").format(
                self._table("aborted_runs")
            ),
            (sink_id, batch_id, run),
        ).fetchone()
        return row is not None

    def prune_decisions(self, sink_id: str, below_batch: int) -> None:
        for table in ("decisions", "committed_units", "aborted_runs"):
            self.conn.execute(
                sql.SQL("DELETE FROM {} WHERE sink_id = %s AND batch_id < %s").format(
                    self._table(table)
                ),
                (sink_id, below_batch),
            )

    def close(self) -> None:
        """Task or driver: the connection back to the thread's pool (closed if it is still
        inside a transaction)."""
        if self._conn is not None:
            give_back(self.options, self._conn)
            self._conn = None

    def _drop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _recorded(self, unit: UnitId) -> bool:
        row = self.conn.execute(
            sql.SQL("SELECT 1 FROM {} WHERE sink_id = %s AND batch_id = %s AND unit = %s").format(
                self._table("committed_units")
            ),
            (unit.sink_id, unit.batch_id, str(unit)),
        ).fetchone()
        return row is not None


def create_aborted_runs(conn: Connection, bookkeeping_schema: str) -> None:
    """The runs of batches the driver aborted (``UnitStore.record_abort``): a task of one
    that prepares after the abort rolls its unit back. Its own statement, so that a
    schema made by an older version gains it at the next start or reset."""
    conn.execute(
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {} ("
            " sink_id text NOT NULL, batch_id bigint NOT NULL, run text NOT NULL,"
            " aborted_at timestamptz NOT NULL DEFAULT now(),"
            " PRIMARY KEY (sink_id, batch_id, run))"
        ).format(sql.Identifier(bookkeeping_schema, "aborted_runs"))
    )


def sink_lock_key(sink_id: str) -> int:
    """A signed 64-bit advisory lock key for a sink id (decisions shared, reset exclusive)."""
    digest = hashlib.sha256(f"{sink_id}|sink".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _check_still_owned(owner: Lineage | None, decision: Decision) -> None:
    """A decision is recorded only while its query owns the sink id: ``eos sinks reset``
    removed the owner while this query ran, and a new query may claim it any moment."""
    if owner is None or owner.query_id != decision.query_id:
        raise SinkResetError(decision.sink_id, decision.batch_id, decision.query_id)


def _lock_key(decision: Decision) -> int:
    """A signed 64-bit advisory lock key for (sink, batch)."""
    digest = hashlib.sha256(f"{decision.sink_id}|{decision.batch_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)
