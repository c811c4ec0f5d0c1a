"""One task's rows into PostgreSQL in the sink's mode (append, upsert, update, a change
stream), inside the caller's transaction: shared by both delivery guarantees (task side)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from eos_connectors.core.errors import BadRecordError, EosError
from eos_connectors.sinks.postgres.options import PostgresSinkOptions

if TYPE_CHECKING:
    import pyarrow as pa

    from eos_connectors.sinks.postgres import changes

LOCK_TIMEOUT = "60s"


ControlTypes = tuple[tuple[str, str], ...]


class TableChangedError(EosError):
    """The sink's table was dropped, or lost a column, after the query's start check."""


class StatementTimeoutError(EosError):
    """A statement that writes a task's rows ran longer than ``statementTimeoutMs``."""


class TaskRows:
    """Writing one task's rows in the sink's mode; shared by both delivery guarantees.
    ``control_types``: the PostgreSQL types of a change stream's control columns."""

    def __init__(
        self, options: PostgresSinkOptions, columns: tuple[str, ...], control_types: ControlTypes
    ) -> None:
        self.options = options
        self.columns = columns
        self.control_types = control_types

    def write(
        self,
        cur: psycopg.Cursor[Any],
        name: str,
        batches: Iterator[pa.RecordBatch],
        before_apply: changes.BeforeApply | None = None,
    ) -> int:
        """Task: the rows into the table; ``before_apply`` sees a keyed mode's stage. A
        table dropped or altered since the start check compared it with the stream's
        schema is named as such (:class:`TableChangedError`)."""
        try:
            return self._write(cur, name, batches, before_apply)
        except psycopg.errors.UndefinedTable as exc:
            raise TableChangedError(
                f"Table {self.options.table_name} (option table) no longer exists: it was "
                "dropped after the query started. Restart the query: its start creates the "
                "table again with createTable=true (the rows written before are gone with it),"
                " or create it first."
            ) from exc
        except psycopg.errors.QueryCanceled as exc:
            if "statement timeout" not in str(exc.diag.message_primary):
                raise  # cancelled by a request (sinks.postgres.waits)
            raise StatementTimeoutError(
                f"Writing the task's rows into {self.options.table_name} (option table) ran "
                f"longer than statementTimeoutMs = {self.options.statement_timeout_ms} and the "
                f"server cancelled it ({exc.diag.message_primary}). Nothing of the task is "
                "written; Spark retries it. Raise statementTimeoutMs, or find what holds the "
                "table's rows or indexes (triggers, a long lock queue, an overloaded server)."
            ) from exc
        except psycopg.errors.UniqueViolation as exc:
            if self.options.mode != "append":
                raise
            raise BadRecordError(
                f"Appending the task's rows into {self.options.table_name} (option table) met "
                f"a key its constraint {exc.diag.constraint_name} refuses: "
                f"{exc.diag.message_detail or exc.diag.message_primary} (a key already in the "
                "table, or twice in the task's rows). Nothing of the task is written. Drop "
                "the duplicates, or write with mode=upsert and keyColumns (the last row of a "
                "key wins)."
            ) from exc
        except psycopg.errors.UndefinedColumn as exc:
            raise TableChangedError(
                f"Table {self.options.table_name} (option table) lost a column the stream "
                f"writes since the query started ({exc.diag.message_primary}): add it back "
                "and restart the query, whose start compares the table with the stream's "
                "schema."
            ) from exc

    def _write(
        self,
        cur: psycopg.Cursor[Any],
        name: str,
        batches: Iterator[pa.RecordBatch],
        before_apply: changes.BeforeApply | None,
    ) -> int:
        from eos_connectors.sinks.postgres import changes, copy  # pyarrow: tasks only

        cur.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(LOCK_TIMEOUT)))
        timeout = sql.Literal(f"{self.options.statement_timeout_ms}ms")
        cur.execute(sql.SQL("SET LOCAL statement_timeout = {}").format(timeout))
        if self.options.mode == "append":
            return copy.append(cur, self.options.table, self.columns, batches)
        if self.options.mode == "update" or self.options.changes.applies_changes:
            return changes.apply(cur, self._target(), name, batches, before_apply).rows
        return copy.upsert(
            cur,
            self.options.table,
            self.options.bookkeeping_schema,
            name,
            self.columns,
            self.options.key_columns,
            batches,
            before_apply,
        )

    def _target(self) -> changes.Target:
        from eos_connectors.sinks.postgres import changes

        return changes.Target(
            table=self.options.table,
            stage_schema=self.options.bookkeeping_schema,
            columns=self.columns,
            keys=self.options.key_columns,
            rules=self.options.changes,
            control_types=self.control_types,
            update_only=self.options.mode == "update",
        )
