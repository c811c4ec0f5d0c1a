"""Publish processed offsets to a consumer group so standard Kafka tools show lag.

The group is a mirror for monitoring only: the source never reads it back.
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, TopicPartition

from eos_connectors.core.kafka_config import logged
from eos_connectors.sources.kafka.offsets import Offsets
from eos_connectors.sources.kafka.options import KafkaSourceOptions

log = logging.getLogger(__name__)


def publish_offsets(options: KafkaSourceOptions, end: Offsets) -> None:
    """Commit ``end`` to ``publishOffsetsToGroup``; a failure is logged, never raised."""
    consumer = Consumer(
        logged(
            {
                **options.client_config(),
                "group.id": options.publish_group,
                "enable.auto.commit": False,
            }
        )
    )
    try:
        offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(end.items())]
        consumer.commit(offsets=offsets, asynchronous=False)
    except KafkaException as exc:
        log.warning(
            "eos_kafka: publishing offsets to group %s failed: %s", options.publish_group, exc
        )
    finally:
        consumer.close()
