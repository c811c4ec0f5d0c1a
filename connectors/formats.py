"""The formats this package adds to Spark, by name: ``eos_kafka``, ``eos_postgres``,
``eos_redis``.

``eos_kafka`` is one format for Spark (one DataSource class per name) with two halves
kept by their own connectors: the source's reading half (``sources/kafka``) and the
sink's writing half (``sinks/kafka``). The class joins them here, above both.
"""

from __future__ import annotations

from eos_connectors.sinks.kafka.format import KafkaSinkFormat
from eos_connectors.sources.kafka.format import KafkaSourceFormat

__all__ = ["KafkaDataSource"]


class KafkaDataSource(KafkaSourceFormat, KafkaSinkFormat):
    """``eos_kafka``: the replayable Kafka source and the transactional Kafka sink."""

    @classmethod
    def name(cls) -> str:
        return "eos_kafka"
