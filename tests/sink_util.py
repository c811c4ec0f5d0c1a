"""An eos_kafka topic as a stream, and one availableNow query from it into a sink, in the
test's session."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import DataFrame, SparkSession

from eos_connectors.dev.endpoints import Endpoints


def earliest(spark: SparkSession, endpoints: Endpoints, topic: str) -> DataFrame:
    """``topic`` through eos_kafka from its earliest offset."""
    return (
        spark.readStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )


def stream_into(
    spark: SparkSession,
    endpoints: Endpoints,
    topic: str,
    checkpoint: Path,
    select: list[str],
    sink: str,
    /,
    **options: str,
) -> None:
    """``topic`` from the earliest offset, ``select``ed, into format ``sink`` with
    ``options`` (positional-only parameters: an option may be called ``topic``); a
    failing query raises."""
    writer = earliest(spark, endpoints, topic).selectExpr(*select).writeStream.format(sink)
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination(300)
