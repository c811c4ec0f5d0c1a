"""``eos_kafka``: the data source Spark instantiates by format name."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, DataSourceStreamWriter
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

from sources.kafka.options import KafkaSourceOptions, parse_options
from sources.kafka.reader import KafkaStreamReader


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


class KafkaDataSource(DataSource):
    """``eos_kafka``: the replayable Kafka source, and the transactional Kafka sink.

    As a source, per-partition offsets are the positions in Spark's checkpoint.

    Guarantee: with a checkpoint location, every record in the subscribed partitions
    (only committed ones under the default read_committed) is delivered to exactly
    one micro-batch, and a replayed batch reads exactly the same records.
    """

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._parsed: KafkaSourceOptions | None = None

    @classmethod
    def name(cls) -> str:
        return "eos_kafka"

    @property
    def config(self) -> KafkaSourceOptions:
        if self._parsed is None:
            self._parsed = parse_options(self.options)
        return self._parsed

    def schema(self) -> StructType:
        return source_schema(self.config.include_headers)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(self.config)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """``eos_kafka`` as a sink: Spark's Kafka sink columns and options, transactional."""
        from connectors.startup import once_per_driver, start_key
        from sinks.kafka import KafkaPlainWriter, KafkaTransactionalWriter
        from sinks.kafka import parse_options as parse_sink_options
        from sinks.kafka.checks import start_checks
        from sinks.kafka.records import check_schema

        options = parse_sink_options(self.options)
        check_schema(schema, has_topic_option=options.topic is not None)
        once_per_driver(start_key("eos_kafka", self.options, schema),
                        lambda: start_checks(options, self.options))  # fmt: skip
        if options.exactly_once:
            return KafkaTransactionalWriter(options)
        return KafkaPlainWriter(options)
