"""Change-stream options and their column-wise evaluation, without a server: which rows are
deletes, the last change per key in Redis entries, tombstones in the Kafka sink's rows."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from eos_connectors.core.change_rows import delete_mask, unordered_change
from eos_connectors.core.changes import ChangeRules, check_schema, parse_changes
from eos_connectors.core.errors import BadRecordError, ConfigError
from eos_connectors.sinks.kafka.options import parse_options as kafka_options
from eos_connectors.sinks.kafka.records import rows
from eos_connectors.sinks.postgres.options import parse_options as postgres_options
from eos_connectors.sinks.redis.layout import layout
from eos_connectors.sinks.redis.options import parse_options as redis_options
from eos_connectors.sinks.redis.values import entries

SCHEMA = StructType(
    [
        StructField("id", StringType()),
        StructField("v", StringType()),
        StructField("op", StringType()),
        StructField("gone", BooleanType()),
        StructField("offset", LongType()),
    ]
)
REDIS = {"url": "redis://127.0.0.1:6379/0", "keyColumn": "id", "valueColumns": "v"}


def test_the_options_say_what_is_missing_or_wrong() -> None:
    assert not parse_changes({}, "x").applies_changes
    with pytest.raises(ConfigError, match="'deleteValue' needs 'deleteColumn'"):
        parse_changes({"deletevalue": "d"}, "x")
    rules = parse_changes({"deletecolumn": "op", "deletevalue": "d", "ordercolumns": "offset"}, "x")
    assert rules.control_columns == ("op", "offset") and rules.written(["id", "op"]) == ("id",)
    check_schema(rules, SCHEMA, ("id",), "x")
    with pytest.raises(ConfigError, match="without 'deleteValue' it must be boolean"):
        check_schema(ChangeRules(delete_column="op"), SCHEMA, ("id",), "x")
    check_schema(ChangeRules(delete_column="gone"), SCHEMA, ("id",), "x")
    with pytest.raises(ConfigError, match="has no column 'lsn'"):
        check_schema(ChangeRules(order_columns=("lsn",)), SCHEMA, ("id",), "x")
    with pytest.raises(ConfigError, match="is a key"):
        check_schema(ChangeRules(order_columns=("id",)), SCHEMA, ("id",), "x")
    with pytest.raises(ConfigError, match="use mode=upsert"):
        postgres_options({"dsn": "host=h", "table": "t", "deleteColumn": "op"})
    with pytest.raises(ConfigError, match="mode=increment adds to counters"):
        layout(
            redis_options(
                {**REDIS, "mode": "increment", "valueColumns": "offset", "deleteColumn": "gone"}
            ),
            SCHEMA,
        )
    with pytest.raises(ConfigError, match="cannot be set: the sink writes"):
        kafka_options(
            {"kafka.bootstrap.servers": "b", "topic": "t", "deleteWhenValuesNull": "true"}
        )


def test_the_kafka_sink_writes_a_tasks_rows_in_order_columns_order() -> None:
    """Issue 52, item 3: after a shuffle a task's rows come in any order; with orderColumns
    each key's changes are written in their order (the last one is what compaction
    keeps), and two changes of a key with no known order are refused."""
    from eos_connectors.sinks.kafka.records import in_order

    options = kafka_options(
        {"kafka.bootstrap.servers": "b", "topic": "t", "orderColumns": "partition,offset"}
    )
    first = pa.RecordBatch.from_pydict(
        {"key": [b"k", b"j"], "value": [b"new", b"j1"], "partition": [0, 0], "offset": [90, 5]}
    )
    second = pa.RecordBatch.from_pydict(
        {"key": [b"k"], "value": [b"old"], "partition": [0], "offset": [10]}
    )
    written = pa.Table.from_batches(list(in_order(iter([first, second]), options.changes)))
    assert written.column("value").to_pylist() == [b"j1", b"old", b"new"]
    tie = pa.RecordBatch.from_pydict(
        {"key": [b"k", b"k"], "value": [b"a", b"b"], "partition": [0, 0], "offset": [7, 7]}
    )
    with pytest.raises(BadRecordError, match=r"Several changes of key b'k'.*offset 7"):
        list(in_order(iter([tie]), options.changes))
    plain = kafka_options({"kafka.bootstrap.servers": "b", "topic": "t"})
    assert list(in_order(iter([first, second]), plain.changes)) == [first, second]


def test_a_row_is_a_delete_by_value_by_flag_or_by_null_values() -> None:
    batch = pa.RecordBatch.from_pydict(
        {
            "op": ["c", "d", None, "u"],
            "gone": [False, None, True, False],
            "v": ["a", None, "b", None],
        }
    )
    assert delete_mask(ChangeRules("op", "d"), batch, ("v",)).to_pylist() == [
        False,
        True,
        False,
        False,
    ]
    assert delete_mask(ChangeRules("gone"), batch, ("v",)).to_pylist() == [
        False,
        False,
        True,
        False,
    ]
    nulls = ChangeRules(delete_when_values_null=True)
    assert delete_mask(nulls, batch, ("v",)).to_pylist() == [False, True, False, True]


def test_redis_keeps_each_keys_last_change_in_order_and_deletes_carry_no_value() -> None:
    spec = layout(
        redis_options(
            {**REDIS, "deleteColumn": "op", "deleteValue": "d", "orderColumns": "offset"}
        ),
        SCHEMA,
    )
    batch = pa.RecordBatch.from_pydict(
        {
            "id": ["a", "b", "a", "c", "b", "c"],
            "v": ["a2", "b1", "a1", "c1", None, "c2"],
            "op": ["u", "c", "c", "c", "d", "u"],
            "offset": [5, 1, 2, 3, 4, 6],
        }
    )
    flat, count = entries(spec, iter([batch]))
    assert count == 6
    assert flat == ["u", "a", "a2", "d", "b", "", "u", "c", "c2"]

    tie = pa.RecordBatch.from_pydict(
        {"id": ["a", "a"], "v": ["1", "2"], "op": ["u", "u"], "offset": [7, 7]}
    )
    with pytest.raises(BadRecordError, match="Several changes of key 'a'"):
        entries(spec, iter([tie]))
    unordered = layout(redis_options({**REDIS, "deleteColumn": "op", "deleteValue": "d"}), SCHEMA)
    with pytest.raises(BadRecordError, match="no orderColumns"):
        entries(unordered, iter([tie]))
    written_null = pa.RecordBatch.from_pydict(
        {"id": ["a"], "v": [None], "op": ["u"], "offset": [1]}
    )
    with pytest.raises(BadRecordError, match="Redis has no null value"):
        entries(spec, iter([written_null]))
    keyless = pa.RecordBatch.from_pydict(
        {"id": [None], "v": ["1"], "op": ["u"], "offset": [41], "topic": ["orders"]}
    )
    with pytest.raises(BadRecordError, match=r"no key .* at topic orders, offset 41"):
        entries(spec, iter([keyless]))


@pytest.mark.parametrize(
    ("first", "second", "known"),
    [
        ((1, 5), (2, 6), True),
        ((1, None), (2, None), False),  # Redis took this (the first column differs)
        ((None, 5), (None, 6), False),
        ((1, 5), (1, 5), False),
        ((1, 5), (1, 6), True),
    ],
)
def test_one_keys_order_is_known_by_the_same_rule_in_every_sink(
    first: tuple[int | None, int | None], second: tuple[int | None, int | None], known: bool
) -> None:
    """Two changes of key 'k' ordered by (a, b): a null in an order column makes the order
    unknown even where another order column differs, as PostgreSQL's check (its stage
    table, sinks/postgres/changes.py) has always said; a single change needs no order."""
    table = pa.table(
        {
            "k": ["k", "k", "z"],
            "a": pa.array([first[0], second[0], None], pa.int64()),
            "b": pa.array([first[1], second[1], None], pa.int64()),
        }
    )
    ordered = table.sort_by([("k", "ascending"), ("a", "ascending"), ("b", "ascending")])
    assert (unordered_change(ordered, "k", ("a", "b")) is None) == known
    schema = StructType(
        [
            StructField("k", StringType()),
            StructField("v", StringType()),
            StructField("a", LongType()),
            StructField("b", LongType()),
        ]
    )
    spec = layout(
        redis_options({**REDIS, "keyColumn": "k", "orderColumns": "a,b"}),
        schema,
    )
    batch = table.append_column("v", pa.array(["1", "2", "3"])).to_batches()[0]
    if known:
        entries(spec, iter([batch]))
    else:
        with pytest.raises(BadRecordError, match="Several changes of key 'k'"):
            entries(spec, iter([batch]))


def test_the_kafka_sink_writes_deletes_as_tombstones_with_their_keys() -> None:
    options = kafka_options(
        {"kafka.bootstrap.servers": "b", "topic": "t", "deleteColumn": "op", "deleteValue": "d"}
    )
    batch = pa.RecordBatch.from_pydict(
        {"key": [b"a", b"b"], "value": [b"1", b"2"], "op": ["u", "d"]}
    )
    (written,) = list(rows(iter([batch]), "t", options.changes))
    assert [(r[1], r[2]) for r in written] == [(b"1", b"a"), (None, b"b")]
    keyless = pa.RecordBatch.from_pydict(
        {"key": [None], "value": [b"1"], "op": ["d"], "partition": [3], "offset": [9]}
    )
    with pytest.raises(BadRecordError, match="no key at partition 3, offset 9"):
        list(rows(iter([keyless]), "t", options.changes))
