"""A local SparkSession set up for this package's pipelines, demos and tests."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# local[N,F]: let a task fail F-1 times (a killed Python worker) before the query fails.
TASK_ATTEMPTS = 4


def local_session(
    app: str = "eos", cores: int = 2, conf: Mapping[str, str] | None = None
) -> SparkSession:
    """A ``local[cores]`` session with the package's data sources registered; ``conf``
    adds or overrides Spark settings (``spark.jars`` for Spark's own Kafka connector)."""
    from pyspark.sql import SparkSession

    from connectors.registry import register

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # listen on loopback only
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(f"local[{cores},{TASK_ATTEMPTS}]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.speculation", "false")
        .config("spark.python.worker.reuse", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config(
            "spark.sql.streaming.stateStore.providerClass",
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        )
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled", "true")
        .config("spark.driver.memory", os.environ.get("EOS_SPARK_DRIVER_MEMORY", "2g"))
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("EOS_SPARK_LOG_LEVEL", "WARN"))
    register(spark)
    return spark
