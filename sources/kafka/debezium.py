"""Debezium change events as rows a change-stream sink applies (see docs/change-streams.md).

Debezium writes one JSON event per changed row: ``before`` and ``after`` (the row,
either may be null), ``op`` (``c`` insert, ``u`` update, ``d`` delete, ``r`` a
snapshot read, ``t`` truncate), ``ts_ms`` and ``source`` (for PostgreSQL ``lsn``,
the change's position in the write-ahead log). Kafka Connect's JSON converter wraps
it as ``{"schema": ..., "payload": event}`` unless ``schemas.enable=false``; both
forms are read. A delete is followed by a tombstone (null value) for log
compaction, which carries no change and is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import functions as F
from pyspark.sql.types import DataType, LongType, StringType, StructField, StructType

from eos_connectors.core.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

#: Columns the rows get beside the row's own (their names must not be the row's).
CHANGE_COLUMNS = ("op", "lsn", "source_ts_ms")


def envelope_schema(row: StructType) -> StructType:
    """One Debezium event of a table whose rows are ``row``."""
    source = StructType([StructField("lsn", LongType()), StructField("ts_ms", LongType())])
    return StructType(
        [
            StructField("before", row),
            StructField("after", row),
            StructField("op", StringType()),
            StructField("ts_ms", LongType()),
            StructField("source", source),
        ]
    )


def debezium_changes(
    events: DataFrame, row: StructType | str, value_column: str = "value"
) -> DataFrame:
    """``events`` (the ``eos_kafka`` source's rows of a Debezium topic) as change rows: the
    row's columns (``after`` for a write, ``before`` for a delete: with the default replica
    identity that holds the key), ``op`` (``c``/``u``/``r`` write, ``d`` delete),
    ``lsn`` and ``source_ts_ms`` from ``source``, and the source's ``topic``,
    ``partition`` and ``offset`` where ``events`` has them. Tombstones are dropped; any
    other value that is no change event fails the query, naming where it is; a truncate
    (``t``) is refused by the sink later as a change without a key.

    Feed the result to a sink with ``deleteColumn=op``, ``deleteValue=d`` and
    ``orderColumns=partition,offset`` (one key's events are in one partition) or ``lsn``.
    """
    schema = row if isinstance(row, StructType) else _struct(row)
    clash = [f.name for f in schema.fields if f.name in CHANGE_COLUMNS]
    if clash:
        raise ConfigError(
            f"The row's column {clash[0]!r} has the name of a change column "
            f"({', '.join(CHANGE_COLUMNS)}): rename it in the schema given here."
        )
    envelope = envelope_schema(schema)
    wrapped = StructType([StructField("payload", envelope)])
    text = F.col(value_column).cast("string")
    event = F.coalesce(F.from_json(text, wrapped).payload, F.from_json(text, envelope))
    place = [c for c in ("topic", "partition", "offset") if c in events.columns]
    parsed = events.select(event.alias("event"), text.alias("__text"), *place)
    # A tombstone (a null value) carries no change and is dropped; any other value that is
    # no change event (Avro bytes, a row unwrapped by ExtractNewRecordState, broken JSON)
    # fails the query where it stands, rather than being dropped unseen.
    no_event = F.col("__text").isNotNull() & F.col("event.op").isNull()
    refused = F.raise_error(_not_an_event(place))
    parsed = parsed.where(F.coalesce(F.when(no_event, refused), F.col("event.op").isNotNull()))
    is_delete = F.col("event.op") == "d"
    fields = [
        F.when(is_delete, F.col(f"event.before.{f.name}"))
        .otherwise(F.col(f"event.after.{f.name}"))
        .alias(f.name)
        for f in schema.fields
    ]
    return parsed.select(
        *fields,
        F.col("event.op").alias("op"),
        F.col("event.source.lsn").alias("lsn"),
        F.col("event.source.ts_ms").alias("source_ts_ms"),
        *place,
    )


def _not_an_event(place: Sequence[str]) -> Column:
    """The message for a value that is no Debezium change event, naming where it is."""
    where = [F.lit(" at")]
    for name in place:
        where += [F.lit(f" {name} "), F.col(name).cast("string")]
    return F.concat(
        F.lit("A record"),
        *(where if place else []),
        F.lit(
            " is not a Debezium change event (a JSON envelope with 'op', wrapped in "
            "'payload' or not): nothing of the batch is written. Read the topic with Kafka "
            "Connect's JSON converter, without ExtractNewRecordState, or filter such "
            "records out before debezium_changes."
        ),
    )


def _struct(ddl: str) -> StructType:
    parsed: DataType = StructType.fromDDL(ddl)
    if not isinstance(parsed, StructType):
        raise ConfigError(
            f"The row schema {ddl!r} is not a list of columns (e.g. 'id INT, name STRING')."
        )
    return parsed
