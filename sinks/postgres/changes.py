"""A change stream into a table, inside the task's transaction: the last change of each key
wins (in ``orderColumns`` order), deletes delete, the rest upserts (or updates).

The rows go through a stage table (COPY), as plain upserts do; one statement then
deletes and writes, so a key is either deleted or written, never both, and a
delete followed by an insert of one key within the batch re-inserts it. See
:mod:`eos_connectors.core.changes` for the options.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql

from eos_connectors.core.change_rows import PLACE_COLUMNS
from eos_connectors.core.changes import ChangeRules
from eos_connectors.core.errors import BadRecordError
from eos_connectors.sinks.postgres.copy import conflict_action, copy_batches
from eos_connectors.sinks.postgres.schema import table_ident

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

Cursor = psycopg.Cursor[tuple[object, ...]]
#: Called with the stage once it holds the task's checked rows, before any row lock on
#: the target (the exactly-once sink claims the keys there: :mod:`.key_claims`).
BeforeApply = Callable[[Cursor, sql.Identifier], None]


@dataclass(frozen=True)
class Target:
    """Where and how a task's changes go."""

    table: tuple[str, ...]
    stage_schema: str
    columns: tuple[str, ...]  # every column of the rows, in their order
    keys: tuple[str, ...]
    rules: ChangeRules
    control_types: tuple[tuple[str, str], ...]  # (control column, PostgreSQL type)
    update_only: bool  # mode=update: existing keys only

    @property
    def written(self) -> tuple[str, ...]:
        return self.rules.written(self.columns)

    @property
    def values(self) -> tuple[str, ...]:
        return tuple(c for c in self.written if c not in self.keys)


@dataclass(frozen=True)
class Applied:
    """What one task's changes did."""

    rows: int
    deletes: int  # rows whose key's last change is a delete
    deleted: int  # rows those deletes removed
    written: int

    @property
    def absent(self) -> int:
        """Deletes of keys the table did not hold: nothing to delete, counted."""
        return self.deletes - self.deleted


def apply(
    cur: Cursor,
    target: Target,
    stage_name: str,
    batches: Iterator[pa.RecordBatch],
    before_apply: BeforeApply | None = None,
) -> Applied:
    """Task: stage the rows, check their keys and order, apply them; say what they did."""
    stage = sql.Identifier(
        target.stage_schema, "stage_" + hashlib.sha256(stage_name.encode()).hexdigest()[:20]
    )
    _create_stage(cur, target, stage)
    rows = copy_batches(cur, stage, target.columns, batches)
    _check_keys(cur, target, stage)
    _check_order(cur, target, stage)
    if before_apply is not None:
        before_apply(cur, stage)
    applied = _apply(cur, target, stage, rows)
    cur.execute(sql.SQL("DROP TABLE {}").format(stage))
    if applied.absent:
        log.info(
            "%d deletes of keys not in %s: nothing to delete",
            applied.absent,
            ".".join(target.table),
        )
    return applied


def _create_stage(cur: Cursor, target: Target, stage: sql.Identifier) -> None:
    """An unlogged stage with the table's types and the control columns (a TEMP table would
    stop the transaction from being prepared)."""
    cur.execute(
        sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
            stage, _list(target.written), table_ident(target.table)
        )
    )
    added: list[sql.Composable] = [
        sql.SQL("ADD COLUMN {} {}").format(sql.Identifier(name), sql.SQL(pg_type))
        for name, pg_type in target.control_types
    ]
    added.append(sql.SQL("ADD COLUMN eos_seq bigint GENERATED ALWAYS AS IDENTITY"))
    cur.execute(sql.SQL("ALTER TABLE {} {}").format(stage, sql.SQL(", ").join(added)))


def _check_keys(cur: Cursor, target: Target, stage: sql.Identifier) -> None:
    """A change without a key cannot be applied: the task fails, writing nothing."""
    null_key = sql.SQL(" OR ").join(
        sql.SQL("{} IS NULL").format(sql.Identifier(k)) for k in target.keys
    )
    where = [c for c in PLACE_COLUMNS if c in target.columns]
    shown = _list(where) if where else sql.SQL("eos_seq")
    row = cur.execute(
        sql.SQL("SELECT {} FROM {} WHERE {} ORDER BY eos_seq LIMIT 1").format(
            shown, stage, null_key
        )
    ).fetchone()
    if row is not None:
        place = ", ".join(f"{n} {v}" for n, v in zip(where or ["row"], row, strict=True))
        raise BadRecordError(
            f"A change has no key ({', '.join(target.keys)} null) at {place}: it cannot be "
            "applied, and nothing of the batch is written. Filter such records out, or give "
            "them a key."
        )


def _check_order(cur: Cursor, target: Target, stage: sql.Identifier) -> None:
    """Two changes of one key need an order: ``orderColumns``, distinct and not null."""
    order = target.rules.order_columns
    unknown: sql.Composable = sql.SQL("true")
    if order:
        nulls = sql.SQL(" OR ").join(sql.SQL("{} IS NULL").format(sql.Identifier(c)) for c in order)
        unknown = sql.SQL("(count(*) > count(DISTINCT ({})) OR bool_or({}))").format(
            _list(order), nulls
        )
    row = cur.execute(
        sql.SQL("SELECT {} FROM {} GROUP BY {} HAVING count(*) > 1 AND {} LIMIT 1").format(
            _list(target.keys), stage, _list(target.keys), unknown
        )
    ).fetchone()
    if row is None:
        return
    key = ", ".join(f"{k}={v!r}" for k, v in zip(target.keys, row, strict=True))
    if order:
        raise BadRecordError(
            f"Several changes of key {key} in one task have the same (or a null) "
            f"{', '.join(order)}, so which applies last is unknown; nothing of the batch is "
            "written. Name orderColumns that are distinct per key (e.g. partition,offset)."
        )
    raise BadRecordError(
        f"Several changes of key {key} in one task, and no orderColumns to say which applies "
        "last; nothing of the batch is written. Set orderColumns (e.g. partition,offset, "
        "or a sequence such as Debezium's source.lsn)."
    )


def _apply(cur: Cursor, target: Target, stage: sql.Identifier, rows: int) -> Applied:
    """One statement: each key's last change, its deletes and its writes."""
    keys = _list(target.keys)
    order = [sql.SQL("{} DESC").format(sql.Identifier(c)) for c in target.rules.order_columns]
    match = sql.SQL(" AND ").join(
        sql.SQL("t.{0} = last.{0}").format(sql.Identifier(k)) for k in target.keys
    )
    statement = sql.SQL(
        "WITH last AS (SELECT DISTINCT ON ({keys}) *, {is_delete} AS eos_delete FROM {stage} l"
        " ORDER BY {keys}, {order}),"
        " gone AS (DELETE FROM {table} t USING last WHERE last.eos_delete AND {match}"
        " RETURNING 1),"
        " put AS ({write})"
        " SELECT (SELECT count(*) FROM last WHERE eos_delete), (SELECT count(*) FROM gone),"
        " (SELECT count(*) FROM put)"
    ).format(
        keys=keys,
        is_delete=_is_delete(target),
        stage=stage,
        order=sql.SQL(", ").join([*order, sql.SQL("eos_seq DESC")]),
        table=table_ident(target.table),
        match=match,
        write=_write(target, match),
    )
    counts = cur.execute(statement).fetchone()
    assert counts is not None
    deletes, deleted, written = (int(c) for c in counts)  # type: ignore[call-overload]
    return Applied(rows, deletes, deleted, written)


def _write(target: Target, match: sql.Composable) -> sql.Composable:
    """The writes of the keys whose last change is not a delete: upsert, or update only."""
    if not target.update_only:
        return sql.SQL(
            "INSERT INTO {table} ({cols}) SELECT {cols} FROM last WHERE NOT eos_delete"
            " ON CONFLICT ({keys}) {action} RETURNING 1"
        ).format(
            table=table_ident(target.table),
            cols=_list(target.written),
            keys=_list(target.keys),
            action=conflict_action(target.values),
        )
    if not target.values:
        return sql.SQL("SELECT 1 FROM last WHERE false")
    sets = sql.SQL(", ").join(
        sql.SQL("{0} = last.{0}").format(sql.Identifier(c)) for c in target.values
    )
    return sql.SQL(
        "UPDATE {table} t SET {sets} FROM last WHERE NOT last.eos_delete AND {match} RETURNING 1"
    ).format(table=table_ident(target.table), sets=sets, match=match)


def _is_delete(target: Target) -> sql.Composable:
    """When a staged row (``l``) is a delete, as the options say; false when none say."""
    rules = target.rules
    parts: list[sql.Composable] = []
    if rules.delete_column is not None and rules.delete_value is not None:
        parts.append(
            sql.SQL("coalesce(l.{}::text = {}, false)").format(
                sql.Identifier(rules.delete_column), sql.Literal(rules.delete_value)
            )
        )
    elif rules.delete_column is not None:
        parts.append(sql.SQL("coalesce(l.{}, false)").format(sql.Identifier(rules.delete_column)))
    if rules.delete_when_values_null and target.values:
        parts.append(
            sql.SQL("({})").format(
                sql.SQL(" AND ").join(
                    sql.SQL("l.{} IS NULL").format(sql.Identifier(c)) for c in target.values
                )
            )
        )
    return sql.SQL(" OR ").join(parts) if parts else sql.SQL("false")


def _list(names: Sequence[str]) -> sql.Composable:
    return sql.SQL(", ").join(map(sql.Identifier, names))
