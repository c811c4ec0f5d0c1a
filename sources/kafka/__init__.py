"""The replayable Kafka source ``eos_kafka``."""

from eos_connectors.sources.kafka.options import KafkaSourceOptions, parse_options
from eos_connectors.sources.kafka.source import KafkaSourceFormat, source_schema

__all__ = ["KafkaSourceFormat", "KafkaSourceOptions", "parse_options", "source_schema"]
