"""From the stream's Arrow batches to flat Redis entries, checked against the options.

An *entry* is ``key, v1, ..., vF``: one value for a string target, one per hash
field for a hash target. Entries travel as one flat list so a whole task's writes
go out in a few large commands. Conversion is columnar (Arrow compute); in
``increment`` mode a task first sums its rows per key, so a key is written once
per task however many rows name it.

A change stream (``deleteColumn`` / ``deleteWhenValuesNull``, see
:mod:`eos_connectors.core.changes`) makes each entry ``op, key, v1, ..., vF`` with
``op`` ``u`` (write) or ``d`` (delete the key); a task keeps each key's last change
in ``orderColumns`` order, so one key is written or deleted once per task.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from eos_connectors.core.change_rows import delete_mask, place, unordered_change
from eos_connectors.core.errors import BadRecordError
from eos_connectors.sinks.redis.layout import Layout

_KEY = "__eos_key"
WRITE, DELETE = "u", "d"


def entries(spec: Layout, batches: Iterator[pa.RecordBatch]) -> tuple[list[bytes | str], int]:
    """The task's writes as one flat list of entries, and the number of input rows."""
    received = list(batches)
    if not received or not sum(b.num_rows for b in received):
        return [], 0
    table = pa.Table.from_batches(received).flatten()  # a struct value: ``struct.field``
    rows = table.num_rows
    if spec.changes.applies_changes:
        table = _last_changes(spec, table)
    keys = _keys(spec, table.column(spec.key_column))
    if spec.deletes:
        return _change_entries(spec, table, keys), rows
    values = [_values(table.column(name), name, keys) for name in spec.value_columns]
    if spec.mode == "increment":
        keys, values = _sum_per_key(keys, values, spec.number == "int")
    return _interleave(keys, [as_text(v) for v in values]), rows


def _last_changes(spec: Layout, table: pa.Table) -> pa.Table:
    """Each key's last change in ``orderColumns`` order; two changes of one key with no
    order to tell them apart are refused."""
    keys = table.column(spec.key_column)
    if keys.null_count:
        at = pc.index(pc.is_null(keys), True).as_py()
        raise BadRecordError(
            f"A change has no key (column '{spec.key_column}' null) at {place(table, at)}: it "
            "cannot be applied. Filter such records out or give them a key. Nothing of this "
            "task was written."
        )
    order = spec.changes.order_columns
    by = [spec.key_column, *order]
    ordered = table.sort_by([(c, "ascending") for c in by])
    at = unordered_change(ordered, spec.key_column, order)
    if at is not None:
        key = ordered.column(spec.key_column)[at].as_py()
        what = f"the same (or a null) {', '.join(order)}" if order else "no orderColumns"
        raise BadRecordError(
            f"Several changes of key {key!r} in this task with {what}, so which applies last "
            "is unknown. Set orderColumns to columns distinct and not null per key (e.g. "
            "partition,offset). Nothing of this task was written."
        )
    if ordered.num_rows < 2:
        return ordered
    head, tail = ordered.slice(0, ordered.num_rows - 1), ordered.slice(1)
    same_key = pc.equal(head.column(spec.key_column), tail.column(spec.key_column))
    last = pc.invert(same_key)
    return ordered.filter(pa.concat_arrays([last.combine_chunks(), pa.array([True])]))


def _change_entries(spec: Layout, table: pa.Table, keys: pa.ChunkedArray) -> list[bytes | str]:
    """``op, key, values...`` per key: deletes carry empty values, writes must have them."""
    deletes = delete_mask(spec.changes, table, spec.value_columns)
    ops = pc.if_else(deletes, DELETE, WRITE)
    columns = []
    for name in spec.value_columns:
        column = table.column(name)
        written = pc.filter(column, pc.invert(deletes))
        _values(written, name, pc.filter(keys, pc.invert(deletes)))
        text = as_text(column)
        columns.append(
            pc.fill_null(text, pa.scalar(b"" if _is_bytes(text.type) else "", text.type))
        )
    return _interleave(ops, [keys, *columns])


def _keys(spec: Layout, column: pa.ChunkedArray) -> pa.ChunkedArray:
    if column.null_count:
        at = pc.index(pc.is_null(column), True).as_py()
        raise BadRecordError(
            f"Column '{spec.key_column}' (option keyColumn) is null in row {at} of this task's "
            "input: filter or fill null keys before the sink. Nothing of this task was written."
        )
    text = column if _is_bytes(column.type) else pc.cast(column, pa.string())
    if spec.key_prefix:
        prefix = pa.scalar(spec.key_prefix, type=text.type)
        text = pc.binary_join_element_wise(prefix, text, pa.scalar("", type=text.type))
    if spec.reserved is not None:
        _check_not_reserved(spec, text)
    return text


def _check_not_reserved(spec: Layout, keys: pa.ChunkedArray) -> None:
    """A data key inside the bookkeeping keyspace would move a watermark or replace a
    decision: refused, naming the record, before anything of the task is written."""
    clashes = pc.starts_with(keys, spec.reserved)
    if pc.any(clashes).as_py():
        at = pc.index(clashes, True).as_py()
        raise BadRecordError(
            f"Key {keys[at].as_py()!r} (column '{spec.key_column}', row {at} of this task's "
            f"input) starts like the sink's bookkeeping keys ({spec.reserved}...). Set option "
            "'keyPrefix' (e.g. 'data:') or 'bookkeepingPrefix' so they cannot meet, or filter "
            "the record. Nothing of this task was written."
        )


def _values(column: pa.ChunkedArray, name: str, keys: pa.ChunkedArray) -> pa.ChunkedArray:
    if column.null_count:
        at = pc.index(pc.is_null(column), True).as_py()
        raise BadRecordError(
            f"Column '{name}' is null for key {keys[at].as_py()!r}: Redis has no null value. "
            "Fill or filter nulls before the sink. Nothing of this task was written."
        )
    return column


def _sum_per_key(
    keys: pa.ChunkedArray, values: list[pa.ChunkedArray], integral: bool
) -> tuple[pa.ChunkedArray, list[pa.ChunkedArray]]:
    target = pa.int64() if integral else pa.float64()
    names = [f"v{i}" for i in range(len(values))]
    table = pa.table([keys, *(pc.cast(v, target) for v in values)], names=[_KEY, *names])
    summed = table.group_by(_KEY, use_threads=False).aggregate([(n, "sum") for n in names])
    return summed.column(_KEY), [summed.column(f"{n}_sum") for n in names]


def as_text(values: pa.ChunkedArray) -> pa.ChunkedArray:
    if _is_bytes(values.type) or pa.types.is_string(values.type):
        return values
    return pc.cast(values, pa.string())


def _interleave(keys: pa.ChunkedArray, values: list[pa.ChunkedArray]) -> list[bytes | str]:
    stride = 1 + len(values)
    flat: list[bytes | str] = [""] * (len(keys) * stride)
    flat[0::stride] = keys.to_pylist()
    for offset, column in enumerate(values, start=1):
        flat[offset::stride] = column.to_pylist()
    return flat


def _is_bytes(data_type: pa.DataType) -> bool:
    return bool(pa.types.is_binary(data_type) or pa.types.is_large_binary(data_type))
