"""Sources: the replayable Kafka source ``eos_kafka``."""

from sources.kafka import KafkaDataSource

__all__ = ["KafkaDataSource"]
