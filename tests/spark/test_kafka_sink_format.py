"""The Kafka sink as Spark's own Kafka sink behaves, in a Spark query: the topic option,
tombstones, timestamps and Java's partitioning; the start checks.

Cost: ~8 s in the session's Spark."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from eos_connectors.core.topics import read_to_end
from eos_connectors.dev.endpoints import Endpoints
from tests.kafka_sink_util import (
    java_partitions,
    read_written,
    source_topics,
    write,
)

pytestmark = [pytest.mark.services, pytest.mark.spark]


@pytest.mark.cost(5)
def test_the_sink_writes_as_sparks_own_kafka_sink_does(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """A source DataFrame written straight to the sink, as Spark's Kafka sink takes it:
    the ``topic`` option wins over its ``topic`` column (the input topic), a null value
    is a tombstone, a ``timestamp`` column sets each record's timestamp, and keys land on
    the partitions a Java producer's default partitioner puts them on (murmur2), here
    checked against a real Java producer."""
    source, out = source_topics(endpoints, unique)
    select = [
        "key",
        "CASE WHEN offset % 7 = 3 THEN NULL ELSE value END AS value",
        "topic",
        "timestamp - INTERVAL 1 DAY AS timestamp",
    ]
    write(spark, endpoints, source, tmp_path, select, topic=out)
    written = read_written(endpoints.kafka, out)
    assert len(written) == 500, "every record went to the option's topic"
    assert len(read_to_end(endpoints.kafka, source)) == 500, "none back to the input"
    tombstones = sum(1 for r in written if r.value == b"")
    source_rows = read_to_end(endpoints.kafka, source)
    assert tombstones == sum(1 for r in source_rows if r.offset % 7 == 3) > 0
    day = 86_400_000
    assert sorted(r.timestamp for r in written) == sorted(r.timestamp - day for r in source_rows)
    ours = {r.key: r.partition for r in written}
    assert len({(r.key, r.partition) for r in written}) == len(ours), "a key on two partitions"
    assert ours == java_partitions(endpoints, sorted(k for k in ours if k), unique)


def test_wrong_types_missing_topic_and_long_timeouts_fail_at_start(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    source, out = source_topics(endpoints, unique)
    with pytest.raises(Exception, match="Column 'value' must be binary or string"):
        write(spark, endpoints, source, tmp_path / "a", ["key", "offset AS value"], topic=out)
    with pytest.raises(Exception, match=r"exceeds the broker's transaction\.max\.timeout\.ms"):
        write(
            spark,
            endpoints,
            source,
            tmp_path / "c",
            ["key", "value"],
            topic=out,
            **{"kafka.transaction.timeout.ms": str(24 * 3600 * 1000)},
        )
    with pytest.raises(Exception, match=f"topic 'absent-{unique}', which does not exist"):
        write(spark, endpoints, source, tmp_path / "b", ["key", "value"], topic=f"absent-{unique}")
