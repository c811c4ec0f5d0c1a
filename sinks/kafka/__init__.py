"""The Kafka sink (``eos_kafka`` as a sink): one transaction per task, fenced and marked."""

from sinks.kafka.options import KafkaSinkOptions, parse_options
from sinks.kafka.writer import KafkaPlainWriter, KafkaTransactionalWriter

__all__ = ["KafkaPlainWriter", "KafkaSinkOptions", "KafkaTransactionalWriter", "parse_options"]
