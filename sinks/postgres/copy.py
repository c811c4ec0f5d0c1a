"""Rows into PostgreSQL in bulk: Arrow batches as CSV through COPY, upserts through a stage."""

from __future__ import annotations

import binascii
import hashlib
import io
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
from psycopg import sql

from eos_connectors.sinks.postgres.schema import table_ident

_CSV = pa_csv.WriteOptions(include_header=False, quoting_style="needed")


def csv_bytes(batch: pa.RecordBatch) -> bytes:
    """One batch as PostgreSQL CSV: NULL unquoted-empty, strings quoted, bytea as hex."""
    columns = [_for_csv(column) for column in batch.columns]
    buffer = io.BytesIO()
    pa_csv.write_csv(pa.RecordBatch.from_arrays(columns, names=batch.schema.names), buffer, _CSV)
    return buffer.getvalue()


def _for_csv(column: pa.Array) -> pa.Array:
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return bytea_text(column)
    return column


def bytea_text(column: pa.Array) -> pa.Array:
    """A binary column as PostgreSQL's bytea text (``\\x`` then hex), from the column's
    buffers at once: the values hex-encoded in one call (each value's offsets doubled),
    then ``\\x`` joined in front of each by Arrow. No Python work per value."""
    large = pa.types.is_large_binary(column.type)
    width = np.int64 if large else np.int32
    skip = column.offset * np.dtype(width).itemsize  # a slice's first offset, in bytes
    offsets = np.frombuffer(column.buffers()[1], width, len(column) + 1, skip)
    first, last = int(offsets[0]), int(offsets[-1])
    data = column.buffers()[2]
    hexed = binascii.hexlify(data[first:last]) if data is not None else b""
    doubled = (2 * (offsets.astype(np.int64) - first)).astype(width)
    validity = pc.is_valid(column).buffers()[1] if column.null_count else None
    kind = pa.large_string() if large else pa.string()
    text = pa.Array.from_buffers(
        kind,
        len(column),
        [validity, pa.py_buffer(doubled), pa.py_buffer(hexed)],
        column.null_count,
    )
    return pc.binary_join_element_wise(pa.scalar("\\x", kind), text, pa.scalar("", kind))


def copy_batches(
    cur: psycopg.Cursor[tuple[object, ...]],
    target: sql.Composable,
    columns: Sequence[str],
    batches: Iterator[pa.RecordBatch],
) -> int:
    """COPY every batch into ``target``; return the row count.

    The COPY runs while Spark computes the task's rows, so the server's
    ``statement_timeout`` (the sink's ``statementTimeoutMs``) is lifted for it alone: it
    would count Spark's time, and a task whose rows took longer to come than the option
    failed on every try. Each wait for the server still has the client's deadline
    (:class:`~.connection.BoundedConnection`), and the statements before and after keep
    the timeout."""
    rows = 0
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT csv)").format(
        target, sql.SQL(", ").join(map(sql.Identifier, columns))
    )
    kept = cur.execute(_LIFT_TIMEOUT).fetchone()
    with cur.copy(statement) as copy:
        for batch in batches:
            if batch.num_rows:
                copy.write(csv_bytes(batch))
                rows += batch.num_rows
    cur.execute(_RESTORE_TIMEOUT, (kept[0] if kept else "0",))
    return rows


#: The transaction's statement timeout, read and lifted in one round trip.
_LIFT_TIMEOUT = sql.SQL(
    "SELECT current_setting('statement_timeout'), set_config('statement_timeout', '0', true)"
)
_RESTORE_TIMEOUT = sql.SQL("SELECT set_config('statement_timeout', %s, true)")


def append(
    cur: psycopg.Cursor[tuple[object, ...]],
    table: Sequence[str],
    columns: Sequence[str],
    batches: Iterator[pa.RecordBatch],
) -> int:
    return copy_batches(cur, table_ident(table), columns, batches)


def upsert(
    cur: psycopg.Cursor[tuple[object, ...]],
    table: Sequence[str],
    stage_schema: str,
    stage_name: str,
    columns: Sequence[str],
    keys: Sequence[str],
    batches: Iterator[pa.RecordBatch],
    before_apply: Callable[[psycopg.Cursor[tuple[object, ...]], sql.Identifier], None]
    | None = None,
) -> int:
    """COPY into a stage table, then one INSERT ... ON CONFLICT; the last row per key wins.

    The stage is a regular unlogged table created and dropped inside the same
    transaction: PostgreSQL refuses to PREPARE a transaction that used a TEMP table.
    """
    stage = sql.Identifier(
        stage_schema, "stage_" + hashlib.sha256(stage_name.encode()).hexdigest()[:20]
    )
    cols = sql.SQL(", ").join(map(sql.Identifier, columns))
    cur.execute(
        sql.SQL("CREATE UNLOGGED TABLE {} AS SELECT {} FROM {} WITH NO DATA").format(
            stage, cols, table_ident(table)
        )
    )
    cur.execute(
        sql.SQL("ALTER TABLE {} ADD COLUMN eos_seq bigint GENERATED ALWAYS AS IDENTITY").format(
            stage
        )
    )
    rows = copy_batches(cur, stage, columns, batches)
    if before_apply is not None:
        before_apply(cur, stage)
    key_cols = sql.SQL(", ").join(map(sql.Identifier, keys))
    cur.execute(
        sql.SQL(
            "INSERT INTO {table} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {stage} "
            "ORDER BY {keys}, eos_seq DESC ON CONFLICT ({keys}) {action}"
        ).format(
            table=table_ident(table),
            cols=cols,
            keys=key_cols,
            stage=stage,
            action=conflict_action([c for c in columns if c not in keys]),
        )
    )
    cur.execute(sql.SQL("DROP TABLE {}").format(stage))
    return rows


def conflict_action(values: Sequence[str]) -> sql.Composable:
    if not values:
        return sql.SQL("DO NOTHING")
    return sql.SQL("DO UPDATE SET {}").format(
        sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c)) for c in values)
    )
