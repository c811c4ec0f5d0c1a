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
    a speculative copy of a sink task would race the attempt the driver commits. Adds
    the options that carry a password inside to the ones Spark redacts
    (:func:`redact_secret_options`).
    """
    if str(spark.conf.get("spark.speculation", "false")).strip().lower() == "true":
        raise ConfigError(
            "spark.speculation is true: the exactly-once sinks need every task attempt but "
            "the last to have failed. Set spark.speculation=false for this session."
        )
    redact_secret_options(spark)
    names = []
    for source in [*data_sources(), *extra]:
        spark.dataSource.register(source)
        names.append(source.name())
    return names


#: Spark's setting: the names of the options whose values its plans print redacted.
OPTIONS_REDACTION = "spark.sql.redaction.options.regex"
#: Spark's default for it (Redis's ``url`` is covered by it).
DEFAULT_OPTIONS_REDACTION = "(?i)url"
#: Options of this package whose value may hold a password that neither its name nor
#: ``spark.redaction.regex`` (password, secret, token, ... in a name or a value) finds: a
#: ``postgresql://user:password@host/db`` URL given as PostgreSQL's ``dsn``.
SECRET_OPTIONS = ("dsn",)


def redact_secret_options(spark: SparkSession) -> None:
    """Driver: ``spark.sql.redaction.options.regex`` extended to ``SECRET_OPTIONS``. Spark
    prints a streaming query's sink options in its plan, and PySpark 4.0 quotes the whole
    plan in a failed query's message: a URL's password showed there on 4.0.5."""
    current = str(spark.conf.get(OPTIONS_REDACTION, DEFAULT_OPTIONS_REDACTION))
    missing = [name for name in SECRET_OPTIONS if name not in current.lower()]
    if missing:
        spark.conf.set(OPTIONS_REDACTION, f"{current}|(?i:{'|'.join(missing)})")
