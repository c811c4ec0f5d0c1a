"""``eos_sqlite``: an exactly-once sink into a SQLite file, built on the package's protocol.

A worked example for connector authors (about 200 lines): SQLite has no prepared
transactions, so, like the Redis sink, each task *stages* its rows under its unit
name and the driver applies a staged unit in one transaction that also deletes the
stage and records the unit as applied. ``BEGIN IMMEDIATE`` takes SQLite's write
lock, which makes each hook atomic against the others, in any process.

Options: ``path`` (the SQLite file, on a file system every executor shares),
``table``, ``keyColumn``, ``valueColumn`` (an integer column), ``mode`` (``upsert``:
the last value wins; ``add``: values add up, where a duplicate would show),
``sinkId``. Guarantee: exactly once; rows become visible when the driver commits
the batch (each task's rows atomically).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter
from pyspark.sql.types import IntegralType, StructType

from eos_connectors.core.errors import ConfigError
from eos_connectors.core.protocol import (
    Decision,
    Lineage,
    Outcome,
    TwoPhaseCommitWriter,
    UnitId,
    UnitMissingError,
    derive_sink_id,
)

_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS eos_owners (sink_id TEXT PRIMARY KEY, query_id TEXT, origin TEXT);
CREATE TABLE IF NOT EXISTS eos_units (unit TEXT PRIMARY KEY, sink_id TEXT, batch_id INTEGER);
CREATE TABLE IF NOT EXISTS eos_stage (unit TEXT, key TEXT, value INTEGER);
CREATE INDEX IF NOT EXISTS eos_stage_unit ON eos_stage (unit);
CREATE TABLE IF NOT EXISTS eos_decisions (sink_id TEXT, batch_id INTEGER, query_id TEXT,
    units TEXT, offsets TEXT, PRIMARY KEY (sink_id, batch_id));
CREATE TABLE IF NOT EXISTS eos_applied (unit TEXT PRIMARY KEY, sink_id TEXT, batch_id INTEGER);
"""


@dataclass(frozen=True)
class SqliteOptions:
    path: str
    table: str
    key_column: str
    value_column: str
    mode: str
    sink_id: str | None

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> SqliteOptions:
        options = {k.lower(): v for k, v in raw.items()}
        missing = [n for n in ("path", "table", "keycolumn", "valuecolumn") if not options.get(n)]
        if missing:
            raise ConfigError(f"eos_sqlite needs option(s) {', '.join(missing)}.")
        mode = options.get("mode", "upsert")
        if mode not in ("upsert", "add"):
            raise ConfigError(f"Option 'mode' must be upsert or add, got {mode!r}.")
        if not options["table"].isidentifier():
            raise ConfigError(f"Option 'table' must be a plain name, got {options['table']!r}.")
        return cls(
            options["path"],
            options["table"],
            options["keycolumn"],
            options["valuecolumn"],
            mode,
            options.get("sinkid"),
        )


def connect(path: str) -> sqlite3.Connection:
    """Autocommit mode (transactions are explicit), WAL so readers never block writers."""
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


class SqliteWriter(TwoPhaseCommitWriter):
    """Exactly-once: tasks stage rows per unit; the driver applies each unit atomically."""

    def __init__(self, options: SqliteOptions) -> None:
        self.options = options
        self._conn: sqlite3.Connection | None = None

    def __getstate__(self) -> dict[str, Any]:  # connections never travel to tasks
        return {"options": self.options, "_conn": None}

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            self._conn = connect(self.options.path)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def sink_id(self, query_id: str) -> str:
        return self.options.sink_id or derive_sink_id("sq", query_id, self.options.table)

    def owner(self, sink_id: str) -> Lineage | None:
        row = self.conn.execute(
            "SELECT query_id, origin FROM eos_owners WHERE sink_id = ?", (sink_id,)
        ).fetchone()
        return None if row is None else Lineage(row[0], row[1])

    def claim(self, sink_id: str, lineage: Lineage) -> Lineage:
        with _immediate(self.conn) as conn:
            conn.execute(
                "INSERT OR IGNORE INTO eos_owners VALUES (?, ?, ?)",
                (sink_id, lineage.query_id, lineage.origin),
            )
            owner = self.owner(sink_id)
        assert owner is not None
        return owner

    def find_decision(self, sink_id: str, batch_id: int) -> Decision | None:
        row = self.conn.execute(
            "SELECT query_id, units, offsets FROM eos_decisions WHERE sink_id = ? AND batch_id = ?",
            (sink_id, batch_id),
        ).fetchone()
        if row is None:
            return None
        units = tuple(u for u in map(UnitId.parse, row[1].split()) if u is not None)
        # offsets: what the stream's batch planned, compared when it is replayed
        return Decision(sink_id, batch_id, row[0], units, row[2] or "")

    def applied_watermark(self, sink_id: str, query_id: str) -> int:
        """The query's highest decided batch (pruning keeps the latest decisions): a stream's
        batch found decided below it was planned again by a checkpoint behind the sink."""
        row = self.conn.execute(
            "SELECT MAX(batch_id) FROM eos_decisions WHERE sink_id = ? AND query_id = ?",
            (sink_id, query_id),
        ).fetchone()
        return -1 if row is None or row[0] is None else int(row[0])

    def prepare(self, unit: UnitId, rows: Iterator[pa.RecordBatch]) -> int:
        """Task: the unit and its staged rows in one transaction."""
        staged = [
            (str(unit), str(key), int(value))
            for batch in rows
            for key, value in zip(
                batch.column(self.options.key_column).to_pylist(),
                batch.column(self.options.value_column).to_pylist(),
                strict=True,
            )
        ]
        if not staged:
            return 0
        with _immediate(self.conn) as conn:
            conn.execute(
                "INSERT INTO eos_units VALUES (?, ?, ?)", (str(unit), unit.sink_id, unit.batch_id)
            )
            conn.executemany("INSERT INTO eos_stage VALUES (?, ?, ?)", staged)
        return len(staged)

    def decide(self, decision: Decision) -> Decision:
        with _immediate(self.conn) as conn:
            recorded = self.find_decision(decision.sink_id, decision.batch_id)
            if recorded is not None:
                return recorded
            missing = [u for u in decision.units if not self._staged(u)]
            if missing:
                raise UnitMissingError(decision.batch_id, missing)
            conn.execute(
                "INSERT INTO eos_decisions VALUES (?, ?, ?, ?, ?)",
                (
                    decision.sink_id,
                    decision.batch_id,
                    decision.query_id,
                    " ".join(map(str, decision.units)),
                    decision.offsets,
                ),
            )
        return decision

    def commit_unit(self, unit: UnitId) -> Outcome:
        """Apply the stage, drop it and record the unit as applied: one transaction."""
        with _immediate(self.conn) as conn:
            if not self._staged(unit):
                applied = conn.execute("SELECT 1 FROM eos_applied WHERE unit = ?", (str(unit),))
                return Outcome.ALREADY_COMMITTED if applied.fetchone() else Outcome.MISSING
            conn.execute(self._apply_sql(), (str(unit),))
            self._drop(unit)
            conn.execute(
                "INSERT INTO eos_applied VALUES (?, ?, ?)", (str(unit), unit.sink_id, unit.batch_id)
            )
        return Outcome.COMMITTED

    def rollback_unit(self, unit: UnitId) -> None:
        with _immediate(self.conn):
            self._drop(unit)

    def rollback_undecided(self, sink_id: str, batch_id: int, units: Sequence[UnitId]) -> bool:
        with _immediate(self.conn):
            if self.find_decision(sink_id, batch_id) is not None:
                return False
            for unit in units:
                self._drop(unit)
        return True

    def units_in_doubt(self, sink_id: str) -> list[UnitId]:
        rows = self.conn.execute("SELECT unit FROM eos_units WHERE sink_id = ?", (sink_id,))
        return sorted(u for u in (UnitId.parse(r[0]) for r in rows) if u is not None)

    def prune_decisions(self, sink_id: str, below_batch: int) -> None:
        with _immediate(self.conn) as conn:
            for table in ("eos_decisions", "eos_applied"):
                conn.execute(
                    f"DELETE FROM {table} WHERE sink_id = ? AND batch_id < ?",  # noqa: S608
                    (sink_id, below_batch),
                )

    def _staged(self, unit: UnitId) -> bool:
        found = self.conn.execute("SELECT 1 FROM eos_units WHERE unit = ?", (str(unit),))
        return found.fetchone() is not None

    def _drop(self, unit: UnitId) -> None:
        self.conn.execute("DELETE FROM eos_stage WHERE unit = ?", (str(unit),))
        self.conn.execute("DELETE FROM eos_units WHERE unit = ?", (str(unit),))

    def _apply_sql(self) -> str:
        table = self.options.table
        new_value = "excluded.value" if self.options.mode == "upsert" else "value + excluded.value"
        # rowid order: in upsert mode the last staged row of a key wins
        return (
            f"INSERT INTO {table} (key, value) SELECT key, value FROM eos_stage "  # noqa: S608
            f"WHERE unit = ? ORDER BY rowid ON CONFLICT (key) DO UPDATE SET value = {new_value}"
        )


class _immediate:  # noqa: N801 - used like a function: `with _immediate(conn) as conn:`
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any exception, a crash included)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> sqlite3.Connection:
        self.conn.execute("BEGIN IMMEDIATE")
        return self.conn

    def __exit__(self, kind: object, *_: object) -> None:
        self.conn.execute("COMMIT" if kind is None else "ROLLBACK")


class SqliteDataSource(DataSource):
    """``eos_sqlite``: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return "eos_sqlite"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Driver: check the columns, create the tables, return the writer."""
        options = SqliteOptions.parse(self.options)
        types = {f.name: f.dataType for f in schema.fields}
        for option, column in (
            ("keyColumn", options.key_column),
            ("valueColumn", options.value_column),
        ):
            if column not in types:
                raise ConfigError(
                    f"Option '{option}' names column {column!r}, not in the "
                    f"stream ({', '.join(types)})."
                )
        if not isinstance(types[options.value_column], IntegralType):
            raise ConfigError(f"Column {options.value_column!r} must be an integer type.")
        if overwrite and options.mode == "add":
            raise ConfigError(
                "outputMode 'complete' with mode=add would add the whole result "
                "every batch; use mode=upsert."
            )
        conn = connect(options.path)
        try:
            conn.executescript(
                _BOOKKEEPING + f"CREATE TABLE IF NOT EXISTS {options.table} "
                "(key TEXT PRIMARY KEY, value INTEGER);"
            )
        finally:
            conn.close()
        return SqliteWriter(options)


def counts(path: str, table: str) -> dict[str, int]:
    """What the table holds: key -> value (the harness's reader for this sink)."""
    conn = connect(path)
    try:
        return {str(k): int(v) for k, v in conn.execute(f"SELECT key, value FROM {table}")}  # noqa: S608
    finally:
        conn.close()
