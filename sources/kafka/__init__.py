"""The replayable Kafka source ``eos_kafka``."""

from eos_connectors.sources.kafka.format import KafkaSourceFormat, source_schema
from eos_connectors.sources.kafka.options import KafkaSourceOptions, parse_options

__all__ = ["KafkaSourceFormat", "KafkaSourceOptions", "parse_options", "source_schema"]
