"""Change streams: which rows are deletes, and in which order one key's changes apply.

A change stream (Debezium and the like) carries a table's inserts, updates and
deletes. The keyed sinks apply it when told how a row says "delete":

* ``deleteColumn`` + ``deleteValue``: the row is a delete when the column's value,
  as text, equals ``deleteValue`` (Debezium's ``op`` = ``d``);
* ``deleteColumn`` alone: a boolean column, true for a delete;
* ``deleteWhenValuesNull=true``: every value column (not a key, not a control
  column) is null, as a Kafka tombstone's value is.

Several changes of one key within one task's rows apply in the order of
``orderColumns`` (ascending: the last one wins; Kafka's ``partition,offset``, or a
sequence such as Debezium's ``source.lsn``). The one rule every sink applies
(:func:`unordered_change`; PostgreSQL states it in SQL over its stage table): a key
with two or more changes in a task needs ``orderColumns``, and among that key's
changes no order column may be null and no two changes may have equal order values.
Otherwise the task is refused: their order cannot be known once Spark has shuffled
them. The delete and order columns are *control columns*: read, never written.

Across the tasks of one batch there is no order: an exactly-once keyed sink
refuses a batch whose key reached two tasks (:class:`KeyAcrossTasksError`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql.types import (
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from eos_connectors.core import options as opt
from eos_connectors.core.errors import BadRecordError, ConfigError

DELETE_COLUMN = opt.Option(
    "deleteColumn",
    opt.required_text,
    "the column that says a row is a delete: a boolean, or compared as text with "
    "`deleteValue` ([change-streams.md](change-streams.md))",
)
DELETE_VALUE = opt.Option(
    "deleteValue",
    lambda value, _name: value,
    "with `deleteColumn`: the value that marks a delete (Debezium's `op` = `d`)",
)
DELETE_WHEN_VALUES_NULL = opt.Option(
    "deleteWhenValuesNull",
    opt.boolean,
    "a row whose value columns are all null deletes its key, as a Kafka tombstone does",
    default=False,
)
ORDER_COLUMNS = opt.Option(
    "orderColumns",
    opt.names,
    "the order of one key's changes within a task, ascending, the last one wins "
    "(`partition,offset`, or a sequence such as Debezium's `source.lsn`); distinct and "
    "not null among one key's changes",
    default=(),
)
#: The options every keyed sink takes for change streams.
CHANGE_OPTIONS = (DELETE_COLUMN, DELETE_VALUE, DELETE_WHEN_VALUES_NULL, ORDER_COLUMNS)
_ORDERABLE = (
    ByteType,
    ShortType,
    IntegerType,
    LongType,
    DecimalType,
    StringType,
    DateType,
    TimestampType,
    TimestampNTZType,
)


@dataclass(frozen=True)
class ChangeRules:
    """How a sink reads a change stream (all empty: every row is an upsert)."""

    delete_column: str | None = None
    delete_value: str | None = None
    delete_when_values_null: bool = False
    order_columns: tuple[str, ...] = ()

    @property
    def deletes(self) -> bool:
        """Whether any row can be a delete."""
        return self.delete_column is not None or self.delete_when_values_null

    @property
    def applies_changes(self) -> bool:
        """Whether the sink applies a change stream (deletes, or an order)."""
        return self.deletes or bool(self.order_columns)

    @property
    def control_columns(self) -> tuple[str, ...]:
        """Columns read to apply the changes and never written."""
        named = ((self.delete_column,) if self.delete_column else ()) + self.order_columns
        return tuple(dict.fromkeys(named))

    def written(self, columns: Sequence[str]) -> tuple[str, ...]:
        """``columns`` without the control columns."""
        return tuple(c for c in columns if c not in self.control_columns)


class KeyAcrossTasksError(BadRecordError):
    """The rows of one key reached two tasks of one batch: the batch is refused."""

    def __init__(
        self, key: str, sink_id: str, batch_id: int, partitions: tuple[int, int], by: str
    ) -> None:
        low, high = sorted(partitions)
        super().__init__(
            f"Key {key} reached two tasks of batch {batch_id} of sink {sink_id!r} (partitions "
            f"{low} and {high} of the sink's input), so neither can apply its changes in "
            "their order: the batch is refused and nothing of it is written. Put each key's "
            f"rows in one task: .repartition({by}) just before the sink. Restart the query "
            "with that change; the batch is replayed with the same source split and applies."
        )


def parse_changes(options: Mapping[str, str], connector: str) -> ChangeRules:
    """Driver: the change-stream options from a sink's lower-cased options."""
    column = DELETE_COLUMN.value(options)
    value = DELETE_VALUE.value(options)
    if value is not None and column is None:
        raise ConfigError(
            f"{connector}: option 'deleteValue' needs 'deleteColumn' (the column it is "
            "compared with, e.g. deleteColumn=op, deleteValue=d for Debezium)."
        )
    return ChangeRules(
        delete_column=column,
        delete_value=value,
        delete_when_values_null=DELETE_WHEN_VALUES_NULL.value(options),
        order_columns=ORDER_COLUMNS.value(options),
    )


def check_schema(
    rules: ChangeRules, schema: StructType, keys: Sequence[str], connector: str
) -> None:
    """Driver: the control columns exist with usable types and are not keys."""
    fields = {f.name: f.dataType for f in schema.fields}
    for name in rules.control_columns:
        if name not in fields:
            raise ConfigError(
                f"{connector}: the stream has no column {name!r} (named by deleteColumn or "
                f"orderColumns); it has {', '.join(fields)}."
            )
        if name in keys:
            raise ConfigError(
                f"{connector}: column {name!r} is a key and cannot also be a delete or order "
                "column."
            )
    column = rules.delete_column
    boolean = column is None or isinstance(fields[column], BooleanType)
    if column is not None and rules.delete_value is None and not boolean:
        raise ConfigError(
            f"{connector}: deleteColumn {column!r} is {fields[column].simpleString()}: "
            "without 'deleteValue' it must be boolean (true: delete). Set deleteValue "
            "to the value that marks a delete (e.g. 'd' for Debezium's op)."
        )
    for name in rules.order_columns:
        if not isinstance(fields[name], _ORDERABLE):
            raise ConfigError(
                f"{connector}: orderColumns names {name!r}, a "
                f"{fields[name].simpleString()} column: use numbers, strings, dates or "
                "timestamps (e.g. partition,offset)."
            )
    if rules.delete_when_values_null and not [
        n for n in fields if n not in keys and n not in rules.control_columns
    ]:
        raise ConfigError(
            f"{connector}: deleteWhenValuesNull=true needs at least one value column "
            "(a column that is neither a key nor a delete or order column)."
        )
