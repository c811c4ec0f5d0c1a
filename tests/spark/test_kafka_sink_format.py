"""The Kafka sink as Spark's own Kafka sink behaves, in a Spark query: the topic option,
tombstones, timestamps and Java's partitioning; the start checks and the claim taken at
the start.

Cost: ~11 s in the session's Spark."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.kafka.checks import check_broker
from eos_connectors.sinks.kafka.options import KafkaSinkOptions
from tests.kafka_sink_util import (
    claim_owner,
    java_partitions,
    read_written,
    source_topics,
    write,
)
from tests.sink_util import earliest
from tests.source_util import wait_for

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


@pytest.mark.cost(6)
def test_wrong_types_missing_topic_and_long_timeouts_fail_at_start(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """Each refused at the query's start, at once, and the sink id left unclaimed: the
    claim comes after the start checks (beside them, the missing topic was named only
    when the claim gave up, 60 s later, and a refused query could take the claim)."""
    from eos_connectors.sinks.kafka.options import parse_options

    source, out = source_topics(endpoints, unique)
    typed = {"topic": out, "sinkId": f"typed-{unique}"}
    options = parse_options({"kafka.bootstrap.servers": endpoints.kafka_bootstrap, **typed})
    check_broker(options)  # the marker log exists, as after any earlier query on the broker
    with pytest.raises(Exception, match="Column 'value' must be binary or string"):
        write(spark, endpoints, source, tmp_path / "a", ["key", "offset AS value"], **typed)
    assert claim_owner(options, typed["sinkId"]) == "", "a query refused at its start claimed"
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
    began = time.monotonic()
    with pytest.raises(Exception, match=f"topic 'absent-{unique}', which does not exist"):
        write(spark, endpoints, source, tmp_path / "b", ["key", "value"], topic=f"absent-{unique}")
    assert time.monotonic() - began < 20, "the missing topic was named only after a wait"


@pytest.mark.cost(3)
def test_a_stream_holds_its_sink_ids_claim_from_its_start_before_any_batch(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """Spark's own call of the sink's ``streamWriter`` at a query's start takes the claim
    on the sink id for the query, under the id its tasks carry (the checkpoint's): the
    input is empty, so no batch and no task ever ran, yet the claim is the query's. The
    first batch's tasks then find it theirs instead of all taking it at once. The driver
    has claimed the sink's decider too (a driver of an earlier run is fenced)."""
    from eos_connectors.sinks.kafka.decisions import decision_group
    from eos_connectors.sinks.kafka.options import parse_options

    source, out = f"ks-in-{unique}", f"ks-out-{unique}"
    create_topic(endpoints.kafka, source, partitions=1)
    create_topic(endpoints.kafka, out, partitions=1)
    sink = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": out}
    query = (
        earliest(spark, endpoints, source)
        .select("key", "value")
        .writeStream.format("eos_kafka")
        .options(**sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="1 second")
        .start()
    )
    options = parse_options(sink)
    sink_id = options.sink_id_for(query.id)
    try:
        wait_for(
            lambda: bool(claim_owner(options, sink_id)) or not query.isActive,
            "the sink id's claim",
            lambda: query.exception() or query.status,
            timeout=60,
        )
        assert claim_owner(options, sink_id) == query.id, query.exception() or query.status
        assert query.lastProgress is None or query.lastProgress["numInputRows"] == 0
        decider = decision_group(options, sink_id)
        wait_for(  # the driver claims it right after the sink id
            lambda: _described(options, decider) is not None or not query.isActive,
            "the decider's claim",
            lambda: query.exception() or query.status,
            timeout=30,
        )
        assert _described(options, decider).producer_epoch >= 0, query.exception()
    finally:
        query.stop()
    assert read_to_end(endpoints.kafka, out) == []


def _described(options: KafkaSinkOptions, transactional_id: str) -> Any:
    """The coordinator's description of ``transactional_id``, None when it holds none."""
    from kafka.errors import TransactionalIdNotFoundError

    from eos_connectors.sinks.kafka.coordinator import TransactionClient

    client = TransactionClient(options.kafka)
    try:
        return client.describe([transactional_id]).get(transactional_id)
    except TransactionalIdNotFoundError:
        return None
    finally:
        client.close()
