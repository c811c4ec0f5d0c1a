"""From the stream's Arrow batches to flat Redis entries, checked against the options.

An *entry* is ``key, v1, ..., vF``: one value for a string target, one per hash
field for a hash target. Entries travel as one flat list so a whole task's writes
go out in a few large commands. Conversion is columnar (Arrow compute); in
``increment`` mode a task first sums its rows per key, so a key is written once
per task however many rows name it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
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

from eos_connectors.core.errors import ConfigError, EosError
from eos_connectors.sinks.redis.options import RedisSinkOptions

_KEY = "__eos_key"


class BadRecordError(EosError):
    """A row the sink cannot write (a null key or value); the task writes nothing."""


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

    @property
    def stride(self) -> int:
        return 1 + max(1, len(self.fields))


def dump_writes(spec: Layout, ttl: int | None) -> str:
    """How a sink applies its stages (mode, arithmetic, hash fields, TTL), as JSON: kept
    with the sink id's owner so ``eos sinks settle`` can apply them without the query."""
    return json.dumps(
        {"mode": spec.mode, "number": spec.number, "fields": list(spec.fields), "ttl": ttl}
    )


def load_writes(text: str) -> tuple[Layout, int | None]:
    """The :class:`Layout` (only what applying a stage needs) and TTL from dump_writes."""
    saved = json.loads(text)
    fields = tuple(saved["fields"])
    spec = Layout("-", "", fields or ("-",), fields, saved["mode"], saved["number"])
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
    return Layout(
        options.key_column,
        options.key_prefix,
        tuple(value_types),
        fields,
        options.mode,
        number,
        reserved if can_collide else None,
    )


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
    keys = _keys(spec, table.column(spec.key_column))
    values = [_values(table.column(name), name, keys) for name in spec.value_columns]
    if spec.mode == "increment":
        keys, values = _sum_per_key(keys, values, spec.number == "int")
    return _interleave(keys, [as_text(v) for v in values]), rows


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
