"""How the Redis sink lays a stream's rows out (driver): the key column, the value
columns (a struct's fields flattened), the target (string or hash), the mode, checked
against the options and the stream's schema when the query starts, and recorded with
each unit (``dump_writes``) so recovery can read it back. Task-side conversion of the
rows is :mod:`eos_connectors.sinks.redis.values`; this module needs no pyarrow, so
Spark's driver-side Python processes that load a writer never import it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

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

from eos_connectors.core.changes import ChangeRules
from eos_connectors.core.changes import check_schema as check_changes
from eos_connectors.core.errors import ConfigError
from eos_connectors.sinks.redis.options import RedisSinkOptions


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
