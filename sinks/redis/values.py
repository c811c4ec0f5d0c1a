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

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BinaryType,
    DataType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegralType,
    StringType,
    StructType,
)

from eos_connectors.core.changes import ChangeRules, delete_mask, place, unordered_change
from eos_connectors.core.changes import check_schema as check_changes
from eos_connectors.core.errors import BadRecordError, ConfigError
from eos_connectors.sinks.redis.options import RedisSinkOptions

_KEY = "__eos_key"
WRITE, DELETE = "u", "d"


@dataclass(frozen=True)
class Layout:
    """Where keys and values come from, and what Redis type they land in."""

    key_column: str
    key_prefix: str
    value_columns: tuple[str, ...]  # Arrow columns after flattening a struct value
    fields: tuple[str, ...]  # hash fields; () for a string target
    mode: Literal["upsert", "increment"]
    number: Literal["int", "float"] | None  # increment mode's arithmetic
    reserved: str | None = None  # the bookkeeping keys' prefix, when a data key can start so
    changes: ChangeRules = field(default_factory=ChangeRules)
    deletes: bool = False  # entries carry an op (a change stream with deletes)

    @property
    def stride(self) -> int:
        return (2 if self.deletes else 1) + max(1, len(self.fields))

    @property
    def script_mode(self) -> str:
        """The scripts' mode: ``changes`` is upsert with an op before each entry."""
        return "changes" if self.deletes else self.mode


def dump_writes(spec: Layout, ttl: int | None) -> str:
    """How a sink applies its stages (mode, arithmetic, hash fields, TTL), as JSON: kept
    with the sink id's owner so ``eos sinks settle`` can apply them without the query."""
    return json.dumps(
        {
            "mode": spec.mode,
            "number": spec.number,
            "fields": list(spec.fields),
            "ttl": ttl,
            "deletes": spec.deletes,
        }
    )


def load_writes(text: str) -> tuple[Layout, int | None]:
    """The :class:`Layout` (only what applying a stage needs) and TTL from dump_writes."""
    saved = json.loads(text)
    fields = tuple(saved["fields"])
    spec = Layout(
        "-",
        "",
        fields or ("-",),
        fields,
        saved["mode"],
        saved["number"],
        deletes=bool(saved.get("deletes", False)),
    )
    return spec, saved["ttl"]


def layout(options: RedisSinkOptions, schema: StructType) -> Layout:
    """Check the stream's columns against the options; a mismatch is a ConfigError."""
    types = {f.name: f.dataType for f in schema.fields}
    key_type = _column(types, options.key_column, "keyColumn")
    if not isinstance(key_type, StringType | BinaryType | IntegralType):
        raise ConfigError(
            f"Column '{options.key_column}' (option keyColumn) is {key_type.simpleString()}; "
            "keys must be string, binary or an integer type: cast it first."
        )
    value_types = {name: _column(types, name, "valueColumns") for name in options.value_columns}
    single = next(iter(value_types.values())) if len(value_types) == 1 else None
    if isinstance(single, StructType):
        struct = options.value_columns[0]
        value_types = {f"{struct}.{f.name}": f.dataType for f in single.fields}
        fields = tuple(f.name for f in single.fields)
    else:
        fields = options.value_columns if len(value_types) > 1 else ()
    number = _number_kind(value_types) if options.mode == "increment" else None
    reserved = options.bookkeeping_keys
    if options.key_prefix.startswith(reserved):
        raise ConfigError(
            f"Option 'keyPrefix' {options.key_prefix!r} starts like the sink's bookkeeping keys "
            f"({reserved}...): data would overwrite the sink's decisions and watermarks. Choose "
            "another keyPrefix, or another bookkeepingPrefix."
        )
    can_collide = reserved.startswith(options.key_prefix)
    _check_changes(options, schema)
    return Layout(
        options.key_column,
        options.key_prefix,
        tuple(value_types),
        fields,
        options.mode,
        number,
        reserved if can_collide else None,
        options.changes,
        options.changes.deletes,
    )


def _check_changes(options: RedisSinkOptions, schema: StructType) -> None:
    """A change stream's control columns; deletes are refused in increment mode."""
    changes = options.changes
    if options.mode == "increment" and changes.applies_changes:
        raise ConfigError(
            "mode=increment adds to counters and cannot apply a change stream (a delete would "
            "lose the counts of other batches): remove deleteColumn, deleteWhenValuesNull and "
            "orderColumns, or use mode=upsert."
        )
    if set(changes.control_columns) & set(options.value_columns):
        raise ConfigError(
            "A delete or order column cannot also be one of valueColumns: it is read, never "
            "written."
        )
    check_changes(changes, schema, (options.key_column,), "eos_redis")


def _column(types: dict[str, DataType], name: str, option: str) -> DataType:
    if name not in types:
        raise ConfigError(
            f"Option '{option}' names column '{name}', which the stream does not have "
            f"(columns: {', '.join(types)})."
        )
    return types[name]


def _number_kind(value_types: dict[str, DataType]) -> Literal["int", "float"]:
    for name, data_type in value_types.items():
        if not isinstance(data_type, IntegralType | FloatType | DoubleType | DecimalType):
            raise ConfigError(
                f"mode=increment adds values to counters, but column '{name}' is "
                f"{data_type.simpleString()}: give a numeric column, or use mode=upsert."
            )
    integral = all(isinstance(t, IntegralType) for t in value_types.values())
    return "int" if integral else "float"


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
