"""``eos_kafka`` as a source: its columns and its reading half."""

from __future__ import annotations

from confluent_kafka import Consumer
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from eos_connectors.core.errors import ConfigError
from eos_connectors.core.kafka_config import check_settings
from eos_connectors.sources.kafka.batch_reader import KafkaBatchReader
from eos_connectors.sources.kafka.options import (
    KafkaSourceOptions,
    check_for_stream,
    parse_options,
    warn_ignored,
)
from eos_connectors.sources.kafka.stream_reader import stream_reader


def source_schema(include_headers: bool) -> StructType:
    """The columns of Spark's built-in Kafka source, in the same order and types."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


class KafkaSourceFormat(DataSource):
    """``eos_kafka``'s reading half: the replayable Kafka source (the format itself is
    :class:`eos_connectors.formats.KafkaDataSource`, with the sink's writing half).

    Per-partition offsets are the positions in Spark's checkpoint.

    Guarantee: with a checkpoint location, every record in the subscribed partitions
    (only committed ones under the default read_committed) is delivered to exactly
    one micro-batch, and a replayed batch reads exactly the same records. A batch read
    returns each record between its starting and ending offsets once.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._parsed: KafkaSourceOptions | None = None

    @property
    def config(self) -> KafkaSourceOptions:
        """Driver: the source's options, parsed once."""
        if self._parsed is None:
            self._parsed = parse_options(self.options)
        return self._parsed

    def schema(self) -> StructType:
        """Driver: Spark's Kafka source columns."""
        return source_schema(self.config.include_headers)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        """Driver: the stream's reader (its ``read`` runs in tasks)."""
        self._check_schema(schema)
        self._check_settings()
        check_for_stream(self.config, self.options)
        warn_ignored(self.options, self.config, batch=False)
        return stream_reader(self.config)

    def reader(self, schema: StructType) -> DataSourceReader:
        """Driver: a batch read's reader, ``spark.read.format("eos_kafka")`` (its ``read``
        runs in tasks)."""
        self._check_schema(schema)
        self._check_settings()
        warn_ignored(self.options, self.config, batch=True)
        return KafkaBatchReader(self.config)

    def _check_settings(self) -> None:
        """Driver: librdkafka takes every ``kafka.*`` setting as the tasks' consumers take it
        (a Java-only name fails here naming the option, not in every task)."""
        settings = {**self.config.client_config(), "group.id": "eos-start-check"}
        check_settings(settings, Consumer, "eos_kafka source", given=self.config.kafka)

    def _check_schema(self, schema: StructType) -> None:
        """Driver: a ``.schema(...)`` the user gave is refused, as Spark's kafka source
        refuses it: the columns are fixed."""
        fixed = self.schema()
        if schema != fixed:
            raise ConfigError(
                "The eos_kafka source has fixed columns (those of Spark's kafka source: "
                f"{fixed.simpleString()}), so .schema(...) cannot set them. Drop .schema(...) "
                "and parse the value after load(), e.g. from_json(col('value').cast('string'), "
                "<schema>)."
            )
