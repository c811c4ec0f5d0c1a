"""``eos sinks`` over PostgreSQL: sink ids from ``<bookkeepingSchema>``'s tables and the
server's prepared transactions (driver-side tooling)."""

from __future__ import annotations

from psycopg import sql

from eos_connectors.core.protocol import Lineage, TwoPhaseCommitWriter, UnitId
from eos_connectors.core.sinks_admin import ResetGuard, SinkAdmin, SinkRecord, UnitInDoubt, refuse
from eos_connectors.sinks.postgres import key_claims
from eos_connectors.sinks.postgres.connection import Connection, connect
from eos_connectors.sinks.postgres.exactly_once import (
    PostgresExactlyOnceWriter,
    create_aborted_runs,
    sink_lock_key,
)
from eos_connectors.sinks.postgres.options import PostgresSinkOptions


class PostgresSinkAdmin(SinkAdmin):
    store = "postgres"

    def __init__(self, dsn: str, bookkeeping_schema: str = "eos") -> None:
        self.options = PostgresSinkOptions(
            dsn, ("-",), "append", (), False, bookkeeping_schema, None, True
        )
        self._conn: Connection | None = None

    @property
    def conn(self) -> Connection:
        if self._conn is None:
            self._conn = connect(self.options)
        return self._conn

    def _table(self, name: str) -> sql.Composable:
        return sql.Identifier(self.options.bookkeeping_schema, name)

    def _exists(self) -> bool:
        row = self.conn.execute(
            "SELECT to_regclass(%s)", (self._table("sinks").as_string(self.conn),)
        ).fetchone()
        return row is not None and row[0] is not None

    def records(self) -> list[SinkRecord]:
        owners: dict[str, tuple[Lineage, str]] = {}
        decided: dict[str, tuple[int, str]] = {}
        idle: dict[str, float] = {}
        if self._exists():
            for sink_id, query_id, origin, target, age in self.conn.execute(
                sql.SQL(
                    "SELECT sink_id, query_id, origin, target, "
                    "extract(epoch FROM now() - claimed_at)::float8 FROM {}"
                ).format(self._table("sinks"))
            ):
                owners[sink_id] = (Lineage(query_id, origin), target)
                idle[sink_id] = float(age)
            # The last decision's offsets through the row's JSON: a table made before that
            # column (format._add_offsets_column) reads as "".
            for sink_id, last, offsets, age in self.conn.execute(
                sql.SQL(
                    "SELECT DISTINCT ON (sink_id) sink_id, batch_id, to_jsonb(d) ->> 'offsets', "
                    "extract(epoch FROM now() - max(decided_at) OVER (PARTITION BY sink_id))"
                    "::float8 FROM {} d ORDER BY sink_id, batch_id DESC"
                ).format(self._table("decisions"))
            ):
                decided[sink_id] = (int(last), offsets or "")
                idle[sink_id] = min(float(age), idle.get(sink_id, float(age)))
        doubt: dict[str, list[UnitInDoubt]] = {}
        for gid, age in self.conn.execute(
            "SELECT gid, extract(epoch FROM now() - prepared)::float8 FROM pg_prepared_xacts "
            "WHERE database = current_database() AND starts_with(gid, 'eos|')"
        ):
            unit = UnitId.parse(gid)
            if unit is not None:
                doubt.setdefault(unit.sink_id, []).append(UnitInDoubt(unit, float(age)))
        return [
            SinkRecord(
                self.store,
                sink_id,
                owners[sink_id][0] if sink_id in owners else None,
                owners[sink_id][1] if sink_id in owners else "",
                decided[sink_id][0] if sink_id in decided else None,
                tuple(sorted(doubt.get(sink_id, []), key=lambda u: u.unit)),
                idle.get(sink_id),
                decided[sink_id][1] if sink_id in decided else "",
            )
            for sink_id in sorted({*owners, *decided, *doubt})
        ]

    def writer(self, record: SinkRecord) -> TwoPhaseCommitWriter:
        table = tuple(record.target.split(".", 1)) if record.target else ("-",)
        options = PostgresSinkOptions(
            self.options.dsn,
            table,
            "append",
            (),
            False,
            self.options.bookkeeping_schema,
            record.sink_id,
            True,
        )
        return PostgresExactlyOnceWriter(options, ())

    def forget(self, sink_id: str, guard: ResetGuard) -> None:
        """Under the sink's lock, exclusively (a decision takes it shared, so none is
        recorded between the check and the delete): check ``guard`` again, delete."""
        if not self._exists():
            return
        with self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (sink_lock_key(sink_id),))
            now = [r for r in self.records() if r.sink_id == sink_id]
            if now:
                refuse(self.store, sink_id, guard.problems(now[0]))
            schema = self.options.bookkeeping_schema
            create_aborted_runs(self.conn, schema)  # a schema made by 0.2 lacks it
            for table in ("sinks", "decisions", "committed_units", "aborted_runs"):
                self.conn.execute(
                    sql.SQL("DELETE FROM {} WHERE sink_id = %s").format(self._table(table)),
                    (sink_id,),
                )
            key_claims.create_table(self.conn, schema)  # a schema made by 0.2 lacks it
            key_claims.forget(self.conn, schema, sink_id, 2**63 - 1)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
