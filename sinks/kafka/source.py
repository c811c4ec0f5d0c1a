"""``eos_kafka`` as a sink: its writing half (the format, with the source's reading half,
is :class:`eos_connectors.formats.KafkaDataSource`)."""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceStreamWriter
from pyspark.sql.types import StructType

from eos_connectors.core.startup import once_per_driver, start_key


class KafkaSinkFormat(DataSource):
    """``eos_kafka``'s writing half: Spark's Kafka sink columns and options, written in one
    fenced, marked transaction per task (see :mod:`eos_connectors.sinks.kafka.exactly_once`)."""

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Driver: check the columns and options, run the start checks once per driver,
        and return the writer (its ``write`` runs in tasks)."""
        from eos_connectors.sinks.kafka import KafkaAtLeastOnceWriter, KafkaExactlyOnceWriter
        from eos_connectors.sinks.kafka import parse_options as parse_sink_options
        from eos_connectors.sinks.kafka.checks import start_checks
        from eos_connectors.sinks.kafka.records import check_schema

        options = parse_sink_options(self.options)
        check_schema(schema, has_topic_option=options.topic is not None)
        once_per_driver(
            start_key("eos_kafka", self.options, schema),
            lambda: start_checks(options, self.options),
        )
        if options.exactly_once:
            return KafkaExactlyOnceWriter(options)
        return KafkaAtLeastOnceWriter(options)
