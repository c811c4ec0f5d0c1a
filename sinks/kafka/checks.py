"""Checks the Kafka sink runs on the driver when a query starts."""

from __future__ import annotations

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from connectors.errors import ConfigError, ServiceUnavailableError
from sinks.kafka.options import KafkaSinkOptions

TIMEOUT = 30.0


def check_broker(options: KafkaSinkOptions) -> None:
    """The named topics exist and transaction.timeout.ms fits the broker's maximum."""
    admin = AdminClient(options.client_config())
    try:
        metadata = admin.list_topics(timeout=TIMEOUT)
    except KafkaException as exc:
        raise ServiceUnavailableError(
            f"Kafka at {options.bootstrap_servers} (option 'kafka.bootstrap.servers') did not "
            f"answer within {TIMEOUT:.0f} s."
        ) from exc
    for option, topic in (("topic", options.topic), ("progressTopic", options.progress_topic)):
        if topic and (topic not in metadata.topics or metadata.topics[topic].error is not None):
            raise ConfigError(
                f"Option '{option}' names topic {topic!r}, which does not exist on "
                f"{options.bootstrap_servers}. Create it first (the sink never auto-creates)."
            )
    if options.exactly_once:
        _check_timeout(admin, options, next(iter(metadata.brokers)))


def _check_timeout(admin: AdminClient, options: KafkaSinkOptions, broker_id: int) -> None:
    resource = ConfigResource("BROKER", str(broker_id))
    try:
        configs = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT)
    except KafkaException:
        return  # not allowed to describe broker configs: the producer reports a bad timeout
    entry = configs.get("transaction.max.timeout.ms")
    if entry is None or entry.value is None:
        return
    maximum = int(entry.value)
    if options.transaction_timeout_ms > maximum:
        raise ConfigError(
            f"kafka.transaction.timeout.ms = {options.transaction_timeout_ms} exceeds the "
            f"broker's transaction.max.timeout.ms = {maximum}; lower it (it must still exceed "
            "the longest batch plus a restart)."
        )
