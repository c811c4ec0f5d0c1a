"""The sink's input columns, as Spark's built-in Kafka sink defines them, checked up front
(driver: when the query or the batch write starts). No pyarrow here: Spark's driver-side
Python processes run this check."""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
    TimestampType,
)

from eos_connectors.core.errors import ConfigError

_BYTES = (BinaryType, StringType)


def check_schema(schema: StructType, has_topic_option: bool) -> None:
    """value (binary|string) required, null for a tombstone; key, topic, partition,
    headers, timestamp optional and typed."""
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise ConfigError(
            f"The eos_kafka sink needs a 'value' column; the stream has {list(fields)}."
        )
    _expect(fields, "value", _BYTES, "binary or string")
    _expect(fields, "key", _BYTES, "binary or string")
    _expect(fields, "topic", (StringType,), "string")
    _expect(fields, "partition", (IntegerType,), "int")
    _expect(fields, "timestamp", (TimestampType,), "timestamp")
    if "headers" in fields and not _is_headers(fields["headers"]):
        raise ConfigError(
            "Column 'headers' must be array<struct<key: string, value: binary>>, "
            f"got {fields['headers'].simpleString()}."
        )
    if "topic" not in fields and not has_topic_option:
        raise ConfigError("Set option 'topic' or give the stream a 'topic' column.")


def _expect(fields: dict[str, DataType], name: str, types: tuple[type, ...], what: str) -> None:
    if name in fields and not isinstance(fields[name], types):
        raise ConfigError(
            f"Column '{name}' must be {what} for the eos_kafka sink, got "
            f"{fields[name].simpleString()}; cast it first."
        )


def _is_headers(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    inner = {f.name: f.dataType for f in data_type.elementType.fields}
    return isinstance(inner.get("key"), StringType) and isinstance(inner.get("value"), BinaryType)
