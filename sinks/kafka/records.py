"""Task: a task's Arrow batches as the records the sink produces (value, key, topic,
partition, headers, timestamp; a change stream's deletes as tombstones, in key order).
The columns themselves are checked up front on the driver: :mod:`.columns`."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc

from eos_connectors.core.change_rows import delete_mask, place, unordered_change
from eos_connectors.core.changes import ChangeRules
from eos_connectors.core.errors import BadRecordError

#: The columns the sink reads as Python values; any other column (a source's offset,
#: say) is never converted, and the timestamp goes through Arrow's arithmetic.
_LISTED = ("value", "topic", "key", "partition", "headers")

Row = tuple[
    str,
    "bytes | str | None",
    "bytes | str | None",
    "int | None",
    "list[tuple[str, bytes]] | None",
    "int | None",
]


def rows(
    batches: Iterator[pa.RecordBatch],
    default_topic: str | None,
    changes: ChangeRules | None = None,
) -> Iterator[list[Row]]:
    """Each Arrow batch as (topic, value, key, partition, headers, timestamp ms) tuples,
    built column-wise.

    As Spark's Kafka sink: the ``topic`` option, when set, wins over a ``topic`` column;
    a null value is written as a tombstone (a compacted topic then forgets the key); a
    ``timestamp`` column sets the record's timestamp (milliseconds; null or no column:
    the producer's clock). A null topic with no ``topic`` option is a BadRecordError:
    the transaction is aborted, nothing lost. ``changes``: the rows its delete condition
    marks are written as tombstones, and must have a key.
    """
    for batch in batches:
        if changes is not None and changes.deletes:
            batch = _tombstones(batch, changes)
        names = batch.schema.names
        columns = {name: batch.column(name).to_pylist() for name in _LISTED if name in names}
        count = batch.num_rows
        values = columns["value"]
        topics = [default_topic] * count if default_topic else columns["topic"]
        if None in topics:
            raise BadRecordError("A record has a null topic and no 'topic' option is set.")
        keys = columns.get("key") or [None] * count
        partitions = columns.get("partition") or [None] * count
        headers = (
            [_headers(h) for h in columns["headers"]] if "headers" in columns else [None] * count
        )
        stamps = _millis(batch.column("timestamp")) if "timestamp" in names else [None] * count
        yield list(zip(topics, values, keys, partitions, headers, stamps, strict=True))


def in_order(
    batches: Iterator[pa.RecordBatch], changes: ChangeRules | None
) -> Iterator[pa.RecordBatch]:
    """Task: the task's rows as they come, or, with ``orderColumns``, all of them sorted by
    those columns (a stable sort), so each key's changes are written in their order. Two
    changes of one key whose order is unknown (a null or an equal order value) are a
    BadRecordError, as in every keyed sink: nothing of the task is committed."""
    order = changes.order_columns if changes is not None else ()
    if not order:
        yield from batches
        return
    held = list(batches)
    if not held:
        return
    table = pa.Table.from_batches(held)
    if "key" in table.schema.names:
        by_key = table.sort_by([("key", "ascending"), *((c, "ascending") for c in order)])
        at = unordered_change(by_key, "key", order)
        if at is not None:
            raise BadRecordError(
                f"Several changes of key {by_key.column('key')[at].as_py()!r} in this task "
                f"with the same (or a null) {', '.join(order)} at {place(by_key, at)}, so "
                "which is written last is unknown. Set orderColumns to columns distinct and "
                "not null per key (e.g. partition,offset). Nothing of this task is committed."
            )
    yield from table.sort_by([(c, "ascending") for c in order]).to_batches()


def _tombstones(batch: pa.RecordBatch, changes: ChangeRules) -> pa.RecordBatch:
    """``batch`` with a null value in each row ``changes`` marks as a delete; a delete
    without a key is a BadRecordError (a tombstone without a key deletes nothing)."""
    deletes = delete_mask(changes, batch, ("value",))
    if "key" not in batch.schema.names:
        keyless = deletes
    else:
        keyless = pc.and_(deletes, pc.is_null(batch.column("key")))
    if pc.any(keyless).as_py():
        at = pc.index(keyless, True).as_py()
        raise BadRecordError(
            f"A delete ({changes.delete_column}) has no key at {place(batch, at)}: a tombstone "
            "needs the key it deletes. Give deletes a key or filter them; nothing of this "
            "task's transaction is committed."
        )
    index = batch.schema.get_field_index("value")
    value = batch.column(index)
    cleared = pc.if_else(deletes, pa.scalar(None, value.type), value)
    return batch.set_column(index, batch.schema.field(index), cleared)


def _millis(column: pa.Array) -> list[int | None]:
    """A timestamp column in milliseconds since the epoch: Spark's microseconds divided
    by 1,000 toward zero, as Spark's sink divides them."""
    micros = pc.cast(column, pa.timestamp("us", tz="UTC")).cast(pa.int64())
    return pc.divide(micros, 1000).to_pylist()  # type: ignore[no-any-return]


def _headers(value: list[dict[str, object]] | None) -> list[tuple[str, bytes]] | None:
    return [(str(h["key"]), h["value"]) for h in value] if value else None  # type: ignore[misc]
