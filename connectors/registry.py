"""Register the package's data sources with a SparkSession."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from eos_connectors.core.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource


def data_sources() -> list[type[DataSource]]:
    """Every data source this package provides (sources and sinks alike)."""
    from eos_connectors.formats import KafkaDataSource
    from eos_connectors.sinks.postgres import PostgresDataSource
    from eos_connectors.sinks.redis import RedisDataSource

    return [KafkaDataSource, PostgresDataSource, RedisDataSource]


def register(spark: SparkSession, extra: Iterable[type[DataSource]] = ()) -> list[str]:
    """Register every data source of this package, and ``extra`` ones (a connector
    author's), with ``spark``; return their format names.

    Works on a classic and a Spark Connect session alike (only ``spark.conf`` and
    ``spark.dataSource`` are used). Refuses a session with speculative execution on:
    a speculative copy of a sink task would race the attempt the driver commits.
    """
    if str(spark.conf.get("spark.speculation", "false")).strip().lower() == "true":
        raise ConfigError(
            "spark.speculation is true: the exactly-once sinks need every task attempt but "
            "the last to have failed. Set spark.speculation=false for this session."
        )
    names = []
    for source in [*data_sources(), *extra]:
        spark.dataSource.register(source)
        names.append(source.name())
    return names
