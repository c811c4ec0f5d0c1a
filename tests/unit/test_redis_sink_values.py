"""eos_redis options and the Arrow -> entries conversion, without a server."""

from __future__ import annotations

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from eos_connectors.core.errors import BadRecordError, ConfigError
from eos_connectors.sinks.redis.layout import Layout, layout
from eos_connectors.sinks.redis.options import parse_options
from eos_connectors.sinks.redis.values import entries

URL = "redis://:s3cret@127.0.0.1:6379/0"
SCHEMA = StructType(
    [
        StructField("word", StringType()),
        StructField("n", LongType()),
        StructField("score", DoubleType()),
        StructField("text", StringType()),
        StructField(
            "pair", StructType([StructField("a", LongType()), StructField("b", LongType())])
        ),
    ]
)


def _layout(**options: str) -> Layout:
    return layout(parse_options({"url": URL, "keyColumn": "word", **options}), SCHEMA)


def _batch(**columns: list[object]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(columns)


def test_options_are_checked_and_the_password_never_shows() -> None:
    parsed = parse_options(
        {"url": URL, "keyColumn": "word", "valueColumns": "n", "ttlSeconds": "60"}
    )
    assert parsed.mode == "upsert" and parsed.exactly_once and parsed.ttl_seconds == 60
    assert "s3cret" not in repr(parsed)
    with pytest.raises(ConfigError, match="Option 'valueColumns' is required"):
        parse_options({"url": URL, "keyColumn": "word"})
    with pytest.raises(ConfigError, match="Option 'ttlSeconds' must be >= 1"):
        parse_options({"url": URL, "keyColumn": "w", "valueColumns": "n", "ttlSeconds": "-1"})
    with pytest.raises(ConfigError, match="Option 'url' must start with") as info:
        parse_options({"url": "http://:s3cret@h", "keyColumn": "w", "valueColumns": "n"})
    assert "s3cret" not in str(info.value)
    spark_set = {"checkpointLocation": "/c", "queryName": "q", "path": "p"}  # Spark's own
    assert parse_options({"url": URL, "keyColumn": "w", "valueColumns": "n", **spark_set})
    with pytest.raises(ConfigError, match="Unknown option 'keycolum'"):
        parse_options({"url": URL, "keyColum": "w", "valueColumns": "n"})


def test_layouts_string_hash_and_struct_targets() -> None:
    assert _layout(valueColumns="n").fields == ()
    assert _layout(valueColumns="n,score", mode="increment").fields == ("n", "score")
    assert _layout(valueColumns="n,score", mode="increment").number == "float"
    struct = _layout(valueColumns="pair", mode="increment")
    assert struct.fields == ("a", "b") and struct.value_columns == ("pair.a", "pair.b")
    assert struct.number == "int"
    with pytest.raises(ConfigError, match="adds values to counters, but column 'text'"):
        _layout(valueColumns="text", mode="increment")
    with pytest.raises(ConfigError, match="Option 'keyColumn' names column 'nope'"):
        layout(parse_options({"url": URL, "keyColumn": "nope", "valueColumns": "n"}), SCHEMA)


def test_increment_sums_per_key_within_a_task() -> None:
    spec = _layout(valueColumns="n", mode="increment", keyPrefix="c:")
    batches = [_batch(word=["a", "b", "a"], n=[1, 2, 3]), _batch(word=["b", "c"], n=[5, 7])]
    flat, rows = entries(spec, iter(batches))
    assert rows == 5
    assert dict(zip(flat[0::2], flat[1::2], strict=True)) == {"c:a": "4", "c:b": "7", "c:c": "7"}


def test_upsert_keeps_every_row_in_order_and_hashes_flatten_structs() -> None:
    flat, _ = entries(
        _layout(valueColumns="text"), iter([_batch(word=["a", "a"], text=["x", "y"])])
    )
    assert flat == ["a", "x", "a", "y"]  # applied in order: the last one wins
    pair = pa.StructArray.from_arrays([pa.array([1]), pa.array([2])], names=["a", "b"])
    batch = pa.RecordBatch.from_arrays([pa.array(["k"]), pair], names=["word", "pair"])
    flat, _ = entries(_layout(valueColumns="pair"), iter([batch]))
    assert flat == ["k", "1", "2"]


def test_null_keys_and_values_are_refused_by_name() -> None:
    with pytest.raises(
        BadRecordError, match=r"Column 'word' \(option keyColumn\) is null in row 1"
    ):
        entries(_layout(valueColumns="n"), iter([_batch(word=["a", None], n=[1, 2])]))
    with pytest.raises(BadRecordError, match="Column 'n' is null for key 'b'"):
        entries(_layout(valueColumns="n"), iter([_batch(word=["a", "b"], n=[1, None])]))


def test_an_empty_task_has_no_entries() -> None:
    assert entries(_layout(valueColumns="n"), iter([])) == ([], 0)


def test_data_keys_never_enter_the_bookkeeping_keyspace() -> None:
    """A data key like ``eos:{sink}:watermark:q`` would move the watermark (a loss); one
    like ``eos:{sink}:decisions`` would stop the query."""
    with pytest.raises(ConfigError, match=r"'keyPrefix' 'eos:\{x\}:' starts like"):
        _layout(valueColumns="n", keyPrefix="eos:{x}:")
    assert _layout(valueColumns="n", keyPrefix="data:").reserved is None, "no check needed"
    spec = _layout(valueColumns="n", keyPrefix="eo")
    assert spec.reserved == "eos:{"
    keys: list[object] = ["a", "s:{sink}:decisions", "b"]
    with pytest.raises(BadRecordError, match=r"Key 'eos:\{sink\}:decisions' .*row 1"):
        entries(spec, iter([_batch(word=keys, n=[1, 2, 3])]))
    fine = entries(_layout(valueColumns="n"), iter([_batch(word=["eos:x", "eos{"], n=[1, 2])]))
    assert fine[1] == 2
    other = _layout(valueColumns="n", bookkeepingPrefix="bk")
    assert entries(other, iter([_batch(word=["eos:{s}:units"], n=[1])]))[1] == 1
