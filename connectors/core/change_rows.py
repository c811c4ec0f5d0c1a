"""Task: a change stream's rows, column-wise (pyarrow): which rows are deletes, where a
row came from, and a key whose changes' order is unknown. The rules themselves, their
options and the driver's checks are :mod:`eos_connectors.core.changes`, which Spark's
driver-side Python processes load without pyarrow."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from eos_connectors.core.changes import ChangeRules


def delete_mask(
    rules: ChangeRules, rows: pa.Table | pa.RecordBatch, values: Sequence[str]
) -> pa.Array | pa.ChunkedArray:
    """Task: whether each row is a delete, as ``rules`` say (``values``: the value columns
    ``deleteWhenValuesNull`` looks at), computed column-wise."""
    mask: pa.Array | pa.ChunkedArray = pa.array([False] * rows.num_rows)
    if rules.delete_column is not None:
        column = rows.column(rules.delete_column)
        if rules.delete_value is not None:
            column = pc.equal(pc.cast(column, pa.string()), rules.delete_value)
        mask = pc.or_(mask, pc.fill_null(column, False))
    if rules.delete_when_values_null and values:
        every = pc.is_null(rows.column(values[0]))
        for name in values[1:]:
            every = pc.and_(every, pc.is_null(rows.column(name)))
        mask = pc.or_(mask, every)
    return mask


#: Columns that say where a record came from, named in errors when the rows have them.
PLACE_COLUMNS = ("topic", "partition", "offset")


def place(rows: pa.Table | pa.RecordBatch, index: int) -> str:
    """Where row ``index`` came from: its ``topic, partition, offset`` when the rows carry
    those columns, else its position in the task's rows."""
    named = [c for c in PLACE_COLUMNS if c in rows.schema.names]
    if not named:
        return f"row {index} of this task's input"
    return ", ".join(f"{c} {rows.column(c)[index].as_py()}" for c in named)


def unordered_change(table: pa.Table, key: str, order: Sequence[str]) -> int | None:
    """Task: the first row of ``table`` (sorted by ``key`` then ``order``) whose key has
    several changes whose order is unknown: no ``order`` columns, a null in one of them,
    or equal order values (the module's rule); None when every key's order is known."""
    if table.num_rows < 2:
        return None
    head, tail = table.slice(0, table.num_rows - 1), table.slice(1)
    same_key = pc.equal(head.column(key), tail.column(key))
    unknown = same_key  # no order columns: every second change of a key is unordered
    if order:
        ties = [pc.fill_null(pc.equal(head[name], tail[name]), True) for name in order]
        nulls = [pc.or_(pc.is_null(head[name]), pc.is_null(tail[name])) for name in order]
        unknown = pc.or_(_all(ties), _any(nulls))
    found = pc.and_(same_key, unknown)
    if not pc.any(found).as_py():
        return None
    index: int = pc.index(found, True).as_py()
    return index


def _all(masks: list[Any]) -> Any:
    result = masks[0]
    for mask in masks[1:]:
        result = pc.and_(result, mask)
    return result


def _any(masks: list[Any]) -> Any:
    result = masks[0]
    for mask in masks[1:]:
        result = pc.or_(result, mask)
    return result
