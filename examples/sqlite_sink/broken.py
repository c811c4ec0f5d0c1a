"""``eos_sqlite_broken``: the example sink with one hook wrong, chosen by the ``breaks``
option; the harness (``eos verify``) must report each as what it breaks.

These are the mistakes a sink author could make, one each: ``partition`` (task
partition 1 reports rows it never staged: lost), ``replay`` (applying a unit keeps its
stage and records nothing, so a commit run again applies it again: duplicated),
``prepare`` (rows applied in the task, before the decision: a replayed batch writes
them again: duplicated), ``rollback`` (a rolled-back unit stays staged: leftovers),
``overwrite`` (applying sets a key to the unit's value instead of adding it: a
count goes back: lost). Never use them for anything but showing that a proof fails.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamWriter
from pyspark.sql.types import StructType

from eos_connectors.core.errors import ConfigError
from eos_connectors.core.protocol import Outcome, UnitId
from examples.sqlite_sink.sink import SqliteDataSource, SqliteOptions, SqliteWriter, _immediate


class DropsAPartition(SqliteWriter):
    def prepare(self, unit: UnitId, rows: Iterator[pa.RecordBatch]) -> int:
        count = super().prepare(unit, rows)
        if unit.partition == 1 and count:
            with _immediate(self.conn) as conn:
                conn.execute("DELETE FROM eos_stage WHERE unit = ?", (str(unit),))
        return count


class CommitsAgain(SqliteWriter):
    def commit_unit(self, unit: UnitId) -> Outcome:
        with _immediate(self.conn) as conn:
            if not self._staged(unit):
                return Outcome.MISSING
            conn.execute(self._apply_sql(), (str(unit),))
        return Outcome.COMMITTED

    def units_in_doubt(self, sink_id: str) -> list[UnitId]:
        return []  # it cannot tell an applied unit from one in doubt


class CommitsAtPrepare(SqliteWriter):
    def prepare(self, unit: UnitId, rows: Iterator[pa.RecordBatch]) -> int:
        count = super().prepare(unit, rows)
        if count:
            with _immediate(self.conn) as conn:
                conn.execute(self._apply_sql(), (str(unit),))
                conn.execute("DELETE FROM eos_stage WHERE unit = ?", (str(unit),))
        return count


class LeavesUnitsBehind(SqliteWriter):
    def rollback_unit(self, unit: UnitId) -> None:
        pass

    def rollback_undecided(self, sink_id: str, batch_id: int, units: Sequence[UnitId]) -> bool:
        return self.find_decision(sink_id, batch_id) is None


class Overwrites(SqliteWriter):
    def _apply_sql(self) -> str:
        table = self.options.table
        return (
            f"INSERT INTO {table} (key, value) SELECT key, value FROM eos_stage "  # noqa: S608
            "WHERE unit = ? ORDER BY rowid ON CONFLICT (key) DO UPDATE SET value = excluded.value"
        )


BROKEN: dict[str, type[SqliteWriter]] = {
    "partition": DropsAPartition,
    "replay": CommitsAgain,
    "prepare": CommitsAtPrepare,
    "rollback": LeavesUnitsBehind,
    "overwrite": Overwrites,
}


class BrokenSqliteDataSource(SqliteDataSource):
    """``eos_sqlite_broken``: ``eos_sqlite`` with the hook the ``breaks`` option names wrong."""

    @classmethod
    def name(cls) -> str:
        return "eos_sqlite_broken"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Driver: the example's checks and tables, then the broken writer."""
        kind = self.options.get("breaks", "")
        if kind not in BROKEN:
            raise ConfigError(f"Option 'breaks' must be one of {', '.join(BROKEN)}, got {kind!r}.")
        options = {k: v for k, v in self.options.items() if k.lower() != "breaks"}
        SqliteDataSource(options).streamWriter(schema, overwrite)
        return BROKEN[kind](SqliteOptions.parse(options))


def in_doubt(path: str) -> list[str]:
    """Units the file holds staged (the harness's leftovers reader for this sink)."""
    from examples.sqlite_sink.sink import connect

    conn = connect(path)
    try:
        return [str(row[0]) for row in conn.execute("SELECT unit FROM eos_units")]
    finally:
        conn.close()
