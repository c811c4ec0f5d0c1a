"""Register the package's data sources with a SparkSession."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import DataSource


def data_sources() -> list[type[DataSource]]:
    """Every data source this package provides (sources and sinks alike)."""
    from sources.kafka import KafkaDataSource

    return [KafkaDataSource]


def register(spark: SparkSession) -> list[str]:
    """Register every data source with ``spark``; return their format names."""
    names = []
    for source in data_sources():
        spark.dataSource.register(source)
        names.append(source.name())
    return names
