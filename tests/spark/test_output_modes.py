"""``outputMode("update")`` into each sink: Spark refuses it itself, for every sink written
in Python, before any of the package's code runs (the README and each sink's page say
so, with the alternatives). If a release lets a hook run first, this test fails and the
sinks must refuse it there with the alternatives. Cost: ~3 s."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from eos_connectors.dev.endpoints import Endpoints

pytestmark = [pytest.mark.services, pytest.mark.spark]


@pytest.mark.cost(3)
def test_update_mode_is_refused_by_spark_for_every_sink(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    counts = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 1)
        .load()
        .groupBy((F.col("value") % 3).alias("key"))
        .count()
    )
    sinks = {
        "eos_kafka": {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": unique},
        "eos_postgres": {"dsn": endpoints.postgres_dsn, "table": f"t_{unique}"},
        "eos_redis": {"url": endpoints.redis_url, "keyColumn": "key"},
    }
    for name, options in sinks.items():
        writer = (
            counts.selectExpr("CAST(key AS STRING) AS key", "CAST(count AS STRING) AS value")
            .writeStream.format(name)
            .options(**options)
            .option("checkpointLocation", str(tmp_path / name))
            .outputMode("update")
        )
        query = writer.start()  # Spark refuses when it plans the first batch
        try:
            with pytest.raises(Exception, match=f"{name} does not support Update mode"):
                query.awaitTermination(60)
        finally:
            query.stop()
