"""Checks the Kafka sink runs on the driver when a query starts."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]
from confluent_kafka.cimpl import NewTopic

from eos_connectors.core.checkpoint_sinks import SinkEntry, record_at_start
from eos_connectors.core.errors import ConfigError, ServiceUnavailableError, keeping_code
from eos_connectors.core.kafka_config import check_settings, logged
from eos_connectors.core.kafka_errors import ClientErrors
from eos_connectors.core.startup import per_driver
from eos_connectors.sinks.kafka.options import TRANSACTION_TIMEOUT, KafkaSinkOptions

TIMEOUT = 30.0
#: The broker's check that a transactional write belongs to an open transaction (KIP-890
#: part 1, Kafka 3.6+, on unless turned off).
VERIFICATION = "transaction.partition.verification.enable"
#: A broker's configuration as confluent-kafka describes it, by name.
BrokerConfigs = Mapping[str, Any]

log = logging.getLogger(__name__)


def start_checks(options: KafkaSinkOptions, raw: Mapping[str, str] | None = None) -> None:
    """Driver, at a query's start: every ``kafka.*`` setting as the tasks' producers take
    it; the broker (:func:`check_broker`); an exactly-once sink recorded in the query's
    checkpoint (``raw``: Spark's options), once a switch of its sink id, bookkeeping
    names or commit mode mid-batch is refused (:mod:`.switch`)."""
    check_producer_settings(options)
    check_broker(options)
    from eos_connectors.sinks.kafka import switch

    if options.exactly_once:
        switch.check_at_start(options, raw or {})
        record_at_start(raw or {}, lambda query_id: checkpoint_entry(options, query_id))
    else:
        switch.check_at_least_once_start(options, raw or {})


def check_producer_settings(options: KafkaSinkOptions) -> None:
    """Driver: librdkafka takes the tasks' producer settings (a Java-only name, or
    ``acks=1`` against the idempotent producer, fails here naming the option)."""
    settings = options.producer_config()
    if options.exactly_once:
        settings = {**settings, "transactional.id": "eos-start-check"}
    check_settings(settings, Producer, "eos_kafka sink", given=options.kafka)


def checkpoint_entry(options: KafkaSinkOptions, query_id: str) -> SinkEntry:
    """The sink as its query's checkpoint records it (see ``core.checkpoint_sinks``)."""
    names = {
        "transactionalIdPrefix": options.transactional_id_prefix,
        "markerLogTopic": options.marker_log,
    }
    target = options.topic or options.progress_topic or ""
    sink_id = options.sink_id_for(query_id)
    return SinkEntry("kafka", sink_id, query_id, target, options.bootstrap_servers, names)


def check_broker(options: KafkaSinkOptions) -> None:
    """Driver: the named topics exist; exactly once: transaction.timeout.ms fits the
    broker's maximum, a warning when the broker does not verify transactional writes
    (:func:`warn_unverified`), the marker log."""
    errors = ClientErrors()
    admin = AdminClient(errors.watching(logged(options.client_config())))
    try:
        metadata = admin.list_topics(timeout=TIMEOUT)
    except KafkaException as exc:
        reason = errors.reason(admin, exc)
        raise keeping_code(
            ServiceUnavailableError(
                f"Kafka at {options.bootstrap_servers} (option 'kafka.bootstrap.servers') did not "
                f"answer within {TIMEOUT:.0f} s: {reason}. Check that the brokers run and are "
                "reachable, and the kafka.security.protocol and kafka.sasl.* options."
            ),
            exc,
        ) from None
    for option, topic in (("topic", options.topic), ("progressTopic", options.progress_topic)):
        if topic and (topic not in metadata.topics or metadata.topics[topic].error is not None):
            raise ConfigError(
                f"Option '{option}' names topic {topic!r}, which does not exist on "
                f"{options.bootstrap_servers}. Create it first (the sink never auto-creates)."
            )
    if options.exactly_once:
        broker = next(iter(metadata.brokers))
        configs = broker_configs(admin, broker)
        if configs is not None:  # else not allowed to describe them: nothing to check
            _check_timeout(options, configs)
            warn_unverified(configs, broker)
        ensure_marker_log(admin, options, options.marker_log in metadata.topics)


def ensure_marker_log(admin: AdminClient, options: KafkaSinkOptions, exists: bool) -> None:
    """The compacted topic whose partition 0 keeps each task partition's last marker for
    good: created when missing (one partition, the broker's replication factor), refused
    when it exists without compaction (deleted markers would be replayed batches)."""
    topic = options.marker_log
    if not exists:
        # hourly segments: only closed segments are compacted, and a task partition whose
        # group offset is gone reads the log's uncompacted tail
        config = {"cleanup.policy": "compact", "segment.ms": "3600000"}
        new = NewTopic(topic, 1, -1, config=config)
        try:
            admin.create_topics([new])[topic].result(TIMEOUT)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise keeping_code(
                    ConfigError(
                        f"Could not create the sink's marker log topic {topic!r} (option "
                        f"'markerLogTopic'): {exc.args[0].str()}. Create it with one partition and "
                        "cleanup.policy=compact, or grant the sink CREATE on it."
                    ),
                    exc,
                ) from None
        return
    resource = ConfigResource("TOPIC", topic)
    try:
        configs = admin.describe_configs([resource])[resource].result(timeout=TIMEOUT)
    except KafkaException:
        return  # not allowed to describe it: the operator vouches for it
    policy = configs.get("cleanup.policy")
    policies = {p.strip() for p in str(policy.value).split(",")} if policy is not None else None
    if policies is not None and policies != {"compact"}:
        raise ConfigError(
            f"Topic {topic!r} (option 'markerLogTopic') has cleanup.policy={policy.value}: "
            "retention would delete the markers that stop replayed batches from being written "
            "twice (with compact,delete too: retention deletes compacted segments). Set "
            "cleanup.policy=compact on it, or name another topic."
        )


def _check_timeout(options: KafkaSinkOptions, configs: BrokerConfigs) -> None:
    maximum = _transaction_max_ms(configs)
    if maximum is None:
        return  # not described: the producer reports a bad timeout
    if options.transaction_timeout_ms > maximum:
        raise ConfigError(
            f"kafka.transaction.timeout.ms = {options.transaction_timeout_ms} exceeds the "
            f"broker's transaction.max.timeout.ms = {maximum}; lower it (it must still exceed "
            "the longest batch plus a restart)."
        )


def warn_unverified(configs: BrokerConfigs, broker_id: int) -> None:
    """Driver: a warning when the broker takes a transactional write without checking
    that its transaction is open (:data:`VERIFICATION` off, or a broker before 3.6). A
    task attempt that writes after the driver ended its transaction (an executor paused
    past its batch) then leaves a hanging transaction on that partition: Kafka's
    coordinator does not know it, so no sweep or timeout ends it."""
    entry = configs.get(VERIFICATION)
    if entry is not None and str(entry.value).lower() == "true":
        return
    found = f"{VERIFICATION}={entry.value}" if entry is not None else f"no {VERIFICATION}"
    log.warning(
        "eos_kafka: broker %s has %s, so it takes a transactional write without checking "
        "that its transaction is still open. A task attempt that writes after the driver "
        "ended its transaction (an executor paused past its batch) would leave a hanging "
        "transaction on that partition, holding every read_committed reader back until "
        "an operator aborts it (kafka-transactions.sh find-hanging, then abort). Set it "
        "to true (Kafka 3.6+; its default): docs/kafka-sink.md",
        broker_id,
        found,
    )


def broker_configs(admin: AdminClient, broker_id: int) -> BrokerConfigs | None:
    """Driver: the broker's configuration; None when it may not be described."""
    resource = ConfigResource("BROKER", str(broker_id))
    try:
        configs: BrokerConfigs = admin.describe_configs([resource])[resource].result(TIMEOUT)
    except KafkaException:
        return None
    return configs


def _transaction_max_ms(configs: BrokerConfigs) -> int | None:
    """The broker's ``transaction.max.timeout.ms``; None when not described."""
    entry = configs.get("transaction.max.timeout.ms")
    return None if entry is None or entry.value is None else int(entry.value)


def with_broker_timeout(options: KafkaSinkOptions, raw: Mapping[str, str]) -> KafkaSinkOptions:
    """Driver, ``commitMode=batch``: a transaction stays open until the driver commits the
    batch, so ``kafka.transaction.timeout.ms``, when not set, is the broker's
    ``transaction.max.timeout.ms`` (the longest batch the coordinator allows); the
    sink's default where the broker's settings may not be described."""
    if any(key.lower() == TRANSACTION_TIMEOUT.key for key in raw):
        return options
    cluster = tuple(sorted((k, str(v)) for k, v in options.client_config().items()))
    if cluster not in _BROKER_MAX:
        try:
            answer = per_driver(
                f"eos_kafka-broker-max|{cluster!r}", lambda: json.dumps(_broker_max(options))
            )
        except KafkaException:
            return options  # the start checks say why Kafka does not answer
        _BROKER_MAX[cluster] = json.loads(answer or "null")
    maximum = _BROKER_MAX[cluster]
    if maximum is None:
        return options
    kafka = {**options.kafka, "transaction.timeout.ms": str(maximum)}
    return replace(options, transaction_timeout_ms=maximum, kafka=kafka)


#: The answers of :func:`_broker_max` in this process, by cluster settings (asked once
#: per driver: :func:`~eos_connectors.core.startup.per_driver` keeps the first for its
#: later processes, the commit's among them).
_BROKER_MAX: dict[tuple[tuple[str, str], ...], int | None] = {}


def _broker_max(options: KafkaSinkOptions) -> int | None:
    admin = AdminClient(logged(options.client_config()))
    brokers = admin.list_topics(timeout=TIMEOUT).brokers
    configs = broker_configs(admin, next(iter(brokers))) if brokers else None
    return _transaction_max_ms(configs) if configs is not None else None
