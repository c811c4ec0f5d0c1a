"""The replayable Kafka source ``eos_kafka``."""

from sources.kafka.options import KafkaSourceOptions, parse_options
from sources.kafka.source import KafkaDataSource, source_schema

__all__ = ["KafkaDataSource", "KafkaSourceOptions", "parse_options", "source_schema"]
