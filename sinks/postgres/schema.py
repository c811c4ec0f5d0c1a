"""Spark types to PostgreSQL types, table creation and compatibility checks.

| Spark | PostgreSQL (created) | also accepted in an existing table |
| --- | --- | --- |
| string | text | varchar, bpchar, name, json, jsonb |
| long | bigint | numeric |
| int | integer | bigint, numeric |
| short, byte | smallint | integer, bigint, numeric |
| double | double precision | numeric |
| float | real | double precision, numeric |
| boolean | boolean | |
| decimal(p,s) | numeric(p,s) | |
| date | date | |
| timestamp | timestamptz | timestamp |
| timestamp_ntz | timestamp | timestamptz |
| binary | bytea | |
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg
from psycopg import sql
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from eos_connectors.core.errors import ConfigError

# Spark type -> (type to create, udt names accepted in an existing table)
_TYPES: dict[type[DataType], tuple[str, frozenset[str]]] = {
    StringType: ("text", frozenset({"text", "varchar", "bpchar", "name", "json", "jsonb"})),
    LongType: ("bigint", frozenset({"int8", "numeric"})),
    IntegerType: ("integer", frozenset({"int4", "int8", "numeric"})),
    ShortType: ("smallint", frozenset({"int2", "int4", "int8", "numeric"})),
    ByteType: ("smallint", frozenset({"int2", "int4", "int8", "numeric"})),
    DoubleType: ("double precision", frozenset({"float8", "numeric"})),
    FloatType: ("real", frozenset({"float4", "float8", "numeric"})),
    BooleanType: ("boolean", frozenset({"bool"})),
    DecimalType: ("numeric", frozenset({"numeric"})),
    DateType: ("date", frozenset({"date"})),
    TimestampType: ("timestamptz", frozenset({"timestamptz", "timestamp"})),
    TimestampNTZType: ("timestamp", frozenset({"timestamp", "timestamptz"})),
    BinaryType: ("bytea", frozenset({"bytea"})),
}


def pg_type(name: str, data_type: DataType) -> str:
    """The PostgreSQL type created for a Spark column."""
    entry = _TYPES.get(type(data_type))
    if entry is None:
        raise ConfigError(
            f"Column {name!r} has Spark type {data_type.simpleString()}, which eos_postgres "
            f"cannot write; cast it to one it writes: {', '.join(t.typeName() for t in _TYPES)}"
            " (docs/postgres-sink.md says which PostgreSQL type each becomes)."
        )
    if isinstance(data_type, DecimalType):
        return f"numeric({data_type.precision},{data_type.scale})"
    return entry[0]


def table_ident(table: Sequence[str]) -> sql.Identifier:
    return sql.Identifier(*table)


def create_table(
    conn: psycopg.Connection[tuple[object, ...]],
    table: Sequence[str],
    schema: StructType,
    keys: Sequence[str],
) -> None:
    columns = [
        sql.SQL("{} {}").format(sql.Identifier(f.name), sql.SQL(pg_type(f.name, f.dataType)))
        for f in schema.fields
    ]
    if keys:
        columns.append(
            sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, keys)))
        )
    conn.execute(
        sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
            table_ident(table), sql.SQL(", ").join(columns)
        )
    )


def table_columns(
    conn: psycopg.Connection[tuple[object, ...]], table: Sequence[str]
) -> dict[str, str] | None:
    """Column name -> udt name of an existing table; None when the table does not exist."""
    regclass = conn.execute(
        "SELECT to_regclass(%s)", (table_ident(table).as_string(conn),)
    ).fetchone()
    if regclass is None or regclass[0] is None:
        return None
    rows = conn.execute(
        """SELECT a.attname, t.typname FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
           WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped""",
        (table_ident(table).as_string(conn),),
    ).fetchall()
    return {str(name): str(udt) for name, udt in rows}


def check_columns(table: str, schema: StructType, columns: dict[str, str]) -> None:
    """Every Spark column exists in the table with a type that holds its values."""
    for field in schema.fields:
        pg_type(field.name, field.dataType)  # unsupported Spark type: clear error
        if field.name not in columns:
            raise ConfigError(
                f"Table {table} has no column {field.name!r} (the stream has "
                f"{', '.join(schema.fieldNames())}). Add it, or select only the table's columns."
            )
        accepted = _TYPES[type(field.dataType)][1]
        if columns[field.name] not in accepted:
            raise ConfigError(
                f"Column {field.name!r} of table {table} is {columns[field.name]}, which cannot "
                f"hold Spark {field.dataType.simpleString()} values; expected one of "
                f"{', '.join(sorted(accepted))}. Cast the column in Spark or alter the table."
            )


def check_unique_key(
    conn: psycopg.Connection[tuple[object, ...]], table: Sequence[str], keys: Sequence[str]
) -> None:
    """Upsert needs a unique index on exactly the key columns (ON CONFLICT's arbiter)."""
    rows = conn.execute(
        """SELECT array_agg(a.attname::text ORDER BY a.attname)
             FROM pg_index i JOIN pg_attribute a
               ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
            WHERE i.indrelid = %s::regclass AND i.indisunique
            GROUP BY i.indexrelid""",
        (table_ident(table).as_string(conn),),
    ).fetchall()
    if sorted(keys) not in [sorted(r[0]) for r in rows]:  # type: ignore[call-overload]
        raise ConfigError(
            f"mode=upsert needs a unique index or primary key on exactly ({', '.join(keys)}) "
            f"of table {'.'.join(table)}; create one, or set keyColumns to the table's key."
        )
