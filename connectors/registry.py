"""Register the package's data sources with a SparkSession."""

from __future__ import annotations

from typing import TYPE_CHECKING

from connectors.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource


def data_sources() -> list[type[DataSource]]:
    """Every data source this package provides (sources and sinks alike)."""
    from sinks.postgres import PostgresDataSource
    from sinks.redis import RedisDataSource
    from sources.kafka import KafkaDataSource

    return [KafkaDataSource, PostgresDataSource, RedisDataSource]


def register(spark: SparkSession) -> list[str]:
    """Register every data source with ``spark``; return their format names.

    Refuses a session with speculative execution on: a speculative copy of a sink
    task would discard the prepared writes of the attempt the driver commits.
    """
    if str(spark.conf.get("spark.speculation", "false")).strip().lower() == "true":
        raise ConfigError(
            "spark.speculation is true: the exactly-once sinks need every task attempt but "
            "the last to have failed. Set spark.speculation=false for this session."
        )
    names = []
    for source in data_sources():
        spark.dataSource.register(source)
        names.append(source.name())
    return names
