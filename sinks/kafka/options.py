"""Options of the ``eos_kafka`` sink, named as Spark's built-in Kafka sink names them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eos_connectors.core import options as opt
from eos_connectors.core.changes import CHANGE_OPTIONS, ChangeRules, parse_changes
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.kafka_errors import QUIET_IDLE_CLOSE
from eos_connectors.core.protocol import derive_sink_id

_KNOWN = {
    "topic",
    "includeHeaders",  # a source option Spark's sink ignores: the headers column is written
    "transactionalIdPrefix",
    "sinkId",
    "txnVersion",
    "deliveryGuarantee",
    "progressTopic",
    "markerLogTopic",
    *CHANGE_OPTIONS,
}
_OWNED = {
    "kafka.transactional.id": "it is derived per task; set transactionalIdPrefix instead",
    "kafka.enable.idempotence": "transactions need the idempotent producer; it is always on",
    "kafka.key.serializer": "write the key column as binary or string",
    "kafka.value.serializer": "write the value column as binary or string",
}
#: Java producers' partitioner classes (Spark's ``kafka.partitioner.class``) and
#: librdkafka's partitioner that places records alike; None: librdkafka has none alike.
JAVA_PARTITIONERS: dict[str, str | None] = {
    "org.apache.kafka.clients.producer.internals.DefaultPartitioner": "murmur2_random",
    "org.apache.kafka.clients.producer.internals.BuiltInPartitioner": "murmur2_random",
    "org.apache.kafka.clients.producer.UniformStickyPartitioner": None,
    "org.apache.kafka.clients.producer.RoundRobinPartitioner": None,
}
#: Where a keyed record goes, as Java's producers (and so Spark's Kafka sink) put it:
#: murmur2 of the key; a record without a key goes to a random partition (librdkafka's
#: default, consistent_random, hashes keys with CRC32 and breaks co-partitioning).
DEFAULT_PARTITIONER = "murmur2_random"
MAX_TRANSACTIONAL_ID = 200
DEFAULT_MARKER_LOG = "eos-sink-markers"
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000


@dataclass(frozen=True)
class KafkaSinkOptions:
    bootstrap_servers: str
    topic: str | None
    progress_topic: str | None
    transactional_id_prefix: str
    sink_id: str | None
    exactly_once: bool
    marker_log: str = DEFAULT_MARKER_LOG
    kafka: dict[str, str] = field(default_factory=dict, repr=False)  # may hold sasl.password
    changes: ChangeRules = field(default_factory=ChangeRules)  # deletes written as tombstones

    @property
    def transaction_timeout_ms(self) -> int:
        return int(self.kafka.get("transaction.timeout.ms", DEFAULT_TRANSACTION_TIMEOUT_MS))

    def sink_id_for(self, query_id: str) -> str:
        """The ``sinkId`` option, else one derived from the query id and the topic."""
        target = self.topic or self.progress_topic or ""
        return self.sink_id or derive_sink_id("k", query_id, target)

    @property
    def marker_topic(self) -> str:
        """The topic whose partition 0 holds the sink's progress marker offsets."""
        topic = self.progress_topic or self.topic
        assert topic is not None  # parse_options guarantees one of them
        return topic

    def client_config(self) -> dict[str, Any]:
        """What every client of the sink needs to reach the cluster: the bootstrap servers
        and the ``kafka.security.*``/``sasl.*``/``ssl.*`` settings (SASL, TLS)."""
        security = {
            k: v for k, v in self.kafka.items() if k.startswith(("security.", "sasl.", "ssl."))
        }
        return {**security, "bootstrap.servers": self.bootstrap_servers}

    def producer_config(self) -> dict[str, Any]:
        return {
            **CONNECT_AT_ONCE,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "log_level": 4,
            "partitioner": DEFAULT_PARTITIONER,
            **self.kafka,
            "bootstrap.servers": self.bootstrap_servers,
            "enable.idempotence": True,
            "transaction.timeout.ms": self.transaction_timeout_ms,
        }


# A task's new transactional producer connects to the brokers as soon as it learns
# them. With librdkafka's default (sparse connections) init_transactions() often found
# no broker up right after the bootstrap connection was retired and asked again only
# after its 500 ms coordinator timer: 55-509 ms against 5-7 ms, measured on the local
# broker; a marker consumer's first committed() likewise took up to 57 ms against 3 ms.
CONNECT_AT_ONCE = {"enable.sparse.connections": False, **QUIET_IDLE_CLOSE}  # clients are pooled


def parse_options(raw: Mapping[str, str]) -> KafkaSinkOptions:
    plain = {k: v for k, v in raw.items() if not k.lower().startswith("kafka.")}
    options = opt.lowered(plain, _KNOWN, "the eos_kafka sink")
    java_partitioner = next(
        (v for k, v in raw.items() if k.lower() == "kafka.partitioner.class"), None
    )
    raw = {k: v for k, v in raw.items() if k.lower() != "kafka.partitioner.class"}
    kafka = opt.kafka_settings(raw, _OWNED)
    if java_partitioner is not None:
        kafka.setdefault("partitioner", _partitioner(java_partitioner.strip()))
    bootstrap = kafka.pop("bootstrap.servers", "")
    if not bootstrap:
        raise ConfigError("Option 'kafka.bootstrap.servers' is required (host:port[,host:port]).")
    topic = options.get("topic") or None
    progress = options.get("progresstopic") or None
    if topic is None and progress is None:
        raise ConfigError(
            "Set option 'topic', or with a 'topic' column set 'progressTopic': an existing topic "
            "whose partition 0 holds the sink's progress markers."
        )
    prefix = options.get("transactionalidprefix", "eos").strip() or "eos"
    sink_id = options.get("sinkid") or None
    guarantee = opt.choice(options, "deliveryGuarantee", opt.DELIVERY_GUARANTEES, "exactly-once")
    return KafkaSinkOptions(
        bootstrap_servers=bootstrap,
        topic=topic,
        progress_topic=progress,
        transactional_id_prefix=prefix,
        sink_id=sink_id,
        exactly_once=guarantee == "exactly-once",
        marker_log=options.get("markerlogtopic", "").strip() or DEFAULT_MARKER_LOG,
        kafka=kafka,
        changes=_changes(options),
    )


def _changes(options: Mapping[str, str]) -> ChangeRules:
    """deleteColumn / deleteValue: the rows written as tombstones. The sink keeps its rows'
    order and a null value is a tombstone already, so nothing else applies here."""
    changes = parse_changes(options, "the eos_kafka sink")
    if changes.order_columns or changes.delete_when_values_null:
        raise ConfigError(
            "The eos_kafka sink writes rows in their order and a null value as a tombstone "
            "already: options orderColumns and deleteWhenValuesNull do not apply to it. "
            "Use deleteColumn (and deleteValue) to write deletes as tombstones."
        )
    return changes


def _partitioner(java_class: str) -> str:
    """librdkafka's partitioner for a Java producer's ``partitioner.class``."""
    if java_class not in JAVA_PARTITIONERS:
        raise ConfigError(
            f"Option 'kafka.partitioner.class' = {java_class!r}: a Java partitioner cannot run "
            "in librdkafka. Give the rows a 'partition' column computed in Spark, or set "
            "'kafka.partitioner' to one of librdkafka's (murmur2_random, the default, places "
            "keys as Java producers do)."
        )
    mapped = JAVA_PARTITIONERS[java_class]
    if mapped is None:
        raise ConfigError(
            f"Option 'kafka.partitioner.class' = {java_class!r} has no librdkafka equivalent "
            "(it ignores keys). Leave it out (keys then go where Java's default puts them) "
            "or give the rows a 'partition' column."
        )
    return mapped


def transactional_id(options: KafkaSinkOptions, sink_id: str, partition: int) -> str:
    """``<prefix>-<sink id>-<task partition>``: stable, so a retry fences its predecessors."""
    name = f"{options.transactional_id_prefix}-{sink_id}-{partition}"
    if len(name) > MAX_TRANSACTIONAL_ID:
        raise ConfigError(
            f"transactional.id {name[:40]}... is {len(name)} characters; keep "
            f"transactionalIdPrefix and sinkId under {MAX_TRANSACTIONAL_ID} together."
        )
    return name
