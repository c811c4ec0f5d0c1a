"""``trigger(continuous=...)`` into each sink. Spark (4.0-4.3) hands a Python sink none of
a continuous query's rows and committed every epoch as written: Spark's own ``kafka``
source into ``eos_kafka`` read 5,200 records, wrote none, and recorded ten epochs in
``commits/``; a later run of the checkpoint started after them. Every sink's commit now
refuses such an epoch (:mod:`eos_connectors.core.continuous`), so ``commits/`` never
moves past rows no sink got. Cost: ~10 s."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints

pytestmark = [pytest.mark.services, pytest.mark.spark]


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


@pytest.mark.cost(10)
def test_no_sink_lets_an_epoch_of_continuous_processing_be_committed(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    rows = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 20)
        .option("numPartitions", 1)
        .load()
        .selectExpr("CAST(value % 5 AS STRING) AS key", "CAST(value AS STRING) AS value")
    )
    create_topic(endpoints.kafka, unique, 1)
    sinks = {
        "eos_kafka": {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": unique},
        "eos_postgres": {
            "dsn": endpoints.postgres_dsn,
            "table": f"t_{unique}",
            "createTable": "true",
        },
        "eos_redis": {"url": endpoints.redis_url, "keyColumn": "key", "valueColumns": "value"},
    }
    for name, options in sinks.items():
        checkpoint = tmp_path / name
        query = (
            rows.writeStream.format(name)
            .options(**options)
            .option("checkpointLocation", str(checkpoint))
            .trigger(continuous="300 milliseconds")
            .start()
        )
        try:
            deadline = time.monotonic() + 30
            while len(_files(checkpoint / "offsets")) < 4 and time.monotonic() < deadline:
                assert query.exception() is None, f"{name}: {query.exception()}"
                time.sleep(0.2)
            epochs = _files(checkpoint / "offsets")
            assert len(epochs) >= 4, f"{name}: the continuous query logged {epochs}"
            assert _files(checkpoint / "commits") == [], (
                f"{name}: epochs {_files(checkpoint / 'commits')} were committed, and their "
                "rows never reached the sink"
            )
        finally:
            query.stop()
