"""Options of the ``eos_kafka`` sink, named as Spark's built-in Kafka sink names them."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from eos_connectors.core import kafka_config
from eos_connectors.core import options as opt
from eos_connectors.core.changes import DELETE_COLUMN, DELETE_VALUE, ChangeRules, parse_changes
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.kafka_errors import QUIET_IDLE_CLOSE
from eos_connectors.core.protocol import derive_sink_id

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

TOPIC = opt.Option(
    "topic",
    opt.required_text,
    "target topic; wins over a `topic` column, as in Spark's sink (required unless rows "
    "carry a `topic` column)",
)
PROGRESS_TOPIC = opt.Option(
    "progressTopic",
    opt.required_text,
    "with a `topic` column and no `topic` option: an existing topic whose partition 0 holds "
    "the markers",
)
TRANSACTIONAL_ID_PREFIX = opt.Option(
    "transactionalIdPrefix",
    opt.required_text,
    "prefix of the tasks' transactional ids; with `sinkId` at most 200 characters",
    default="eos",
)
MARKER_LOG_TOPIC = opt.Option(
    "markerLogTopic",
    opt.required_text,
    "compacted topic keeping every task partition's last marker and the claim, created at "
    "start if missing (needs CREATE, else create it: 1 partition, `cleanup.policy=compact`); "
    "one whose `cleanup.policy` is not `compact` alone (`delete`, `compact,delete`) is refused",
    default=DEFAULT_MARKER_LOG,
)
INCLUDE_HEADERS = opt.Option(
    "includeHeaders",
    opt.boolean,
    "accepted and ignored, as Spark's sink does (a source option; the `headers` column is "
    "always written)",
)
BOOTSTRAP_SERVERS = opt.Option(
    "kafka.bootstrap.servers", opt.required_text, "the brokers, `host:port[,host:port]` (required)"
)
TRANSACTION_TIMEOUT = opt.Option(
    "kafka.transaction.timeout.ms",
    opt.integer(1),
    "checked at start against the broker's `transaction.max.timeout.ms`; it must exceed the "
    "time a task takes to write its rows. With `commitMode=batch`, unset, it is the broker's "
    "`transaction.max.timeout.ms`, and a batch whose oldest transaction is within a tenth of "
    "it (at least 10 s) of timing out when the driver would decide fails undecided",
    default=DEFAULT_TRANSACTION_TIMEOUT_MS,
)
PARTITIONER_CLASS = opt.Option(
    "kafka.partitioner.class",
    opt.required_text,
    "a Java producer's partitioner class: the default ones are translated to librdkafka's "
    "`murmur2_random` (where Java's producers put a key); others are refused",
)
_OWNED = (
    opt.Option(
        "kafka.transactional.id",
        opt.text,
        "",
        refused="it is derived per task; set transactionalIdPrefix instead",
    ),
    opt.Option(
        "kafka.enable.idempotence",
        opt.text,
        "",
        refused="transactions need the idempotent producer; it is always on",
    ),
    opt.Option(
        "kafka.key.serializer", opt.text, "", refused="write the key column as binary or string"
    ),
    opt.Option(
        "kafka.value.serializer",
        opt.text,
        "",
        refused="write the value column as binary or string",
    ),
)
_NO_NULL_DELETE = (
    "the sink writes a null value as a tombstone already; use deleteColumn (and "
    "deleteValue) to write other rows as tombstones"
)
COMMIT_MODES = ("task", "batch")
COMMIT_MODE = opt.Option(
    "commitMode",
    opt.choice(*COMMIT_MODES),
    "`batch`: tasks leave their transactions open and the driver commits them all once the "
    "batch (or the batch write's `txnVersion`) is decided, so nothing is visible before and "
    "a replay in any shape writes each record once; the driver needs to reach the "
    "transaction coordinators (Kafka 3.0+). `task`, the fallback: each task commits its own "
    "transaction (visible before the batch completes; exactly once under deterministic "
    "replay)",
    default="batch",
)
ORDER_COLUMNS = opt.Option(
    "orderColumns",
    opt.names,
    "write each task's rows sorted by these columns (ascending), so one key's changes "
    "reach the topic in their order and compaction keeps the last; distinct and not null "
    "among one key's changes. The task's rows are held in memory to sort them. Across "
    "tasks of a batch there is no order: keep each key in one task",
    default=(),
)
OPTIONS = opt.OptionTable(
    "the eos_kafka sink",
    [
        BOOTSTRAP_SERVERS,
        TOPIC,
        PROGRESS_TOPIC,
        TRANSACTIONAL_ID_PREFIX,
        MARKER_LOG_TOPIC,
        INCLUDE_HEADERS,
        *opt.SINK_OPTIONS,
        DELETE_COLUMN,
        DELETE_VALUE,
        ORDER_COLUMNS,
        opt.Option("deleteWhenValuesNull", opt.text, "", refused=_NO_NULL_DELETE),
        TRANSACTION_TIMEOUT,
        COMMIT_MODE,
        PARTITIONER_CLASS,
        *_OWNED,
    ],
    passthrough=("kafka.",),
)


@dataclass(frozen=True)
class KafkaSinkOptions:
    topic: str | None
    progress_topic: str | None
    transactional_id_prefix: str
    sink_id: str | None
    exactly_once: bool
    marker_log: str = DEFAULT_MARKER_LOG
    #: librdkafka's settings (bootstrap.servers among them); may hold sasl.password
    kafka: dict[str, str] = field(default_factory=dict, repr=False)
    changes: ChangeRules = field(default_factory=ChangeRules)  # deletes written as tombstones
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    commit_mode: str = "batch"  # or "task": the driver commits (sinks/kafka/batch_commit.py)

    @property
    def bootstrap_servers(self) -> str:
        return kafka_config.bootstrap(self.kafka)

    def sink_id_for(self, query_id: str) -> str:
        """The ``sinkId`` option, else one derived from the query id and the topic."""
        target = self.topic or self.progress_topic or ""
        return self.sink_id or derive_sink_id("k", query_id, target)

    def unreported_sink_id(self, checkpoint: str | None) -> str | None:
        """Driver, in an abort no task reported to: the ``sinkId`` option, else the id of
        the query id in the ``checkpoint``'s metadata; None when neither can be told."""
        from eos_connectors.core.checkpoint_sinks import sink_of_checkpoint

        return self.sink_id or sink_of_checkpoint(checkpoint, self.sink_id_for)

    @property
    def marker_topic(self) -> str:
        """The topic whose partition 0 holds the sink's progress marker offsets."""
        topic = self.progress_topic or self.topic
        assert topic is not None  # parse_options guarantees one of them
        return topic

    def client_config(self) -> dict[str, Any]:
        """What every client of the sink needs to reach the cluster: the bootstrap servers
        and the ``kafka.security.*``/``sasl.*``/``ssl.*`` settings (SASL, TLS)."""
        return kafka_config.connection(self.kafka)

    def producer_config(self) -> dict[str, Any]:
        return {
            **CONNECT_AT_ONCE,
            "linger.ms": 5,
            "batch.size": 1_000_000,
            "log_level": 4,
            "partitioner": DEFAULT_PARTITIONER,
            **self.kafka,
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
    """Driver: ``raw`` as a frozen value; ConfigError naming the option otherwise."""
    options = OPTIONS.lowered(raw)
    given = {k: v for k, v in raw.items() if k.lower() != PARTITIONER_CLASS.key}
    kafka = kafka_config.from_options(given, {})
    java_partitioner = PARTITIONER_CLASS.value(options)
    if java_partitioner is not None:
        kafka.setdefault("partitioner", _partitioner(java_partitioner))
    timeout = TRANSACTION_TIMEOUT.value(options)
    kafka["transaction.timeout.ms"] = str(timeout)
    topic = TOPIC.value(options)
    progress = PROGRESS_TOPIC.value(options)
    if topic is None and progress is None:
        raise ConfigError(
            "Set option 'topic', or with a 'topic' column set 'progressTopic': an existing topic "
            "whose partition 0 holds the sink's progress markers."
        )
    return KafkaSinkOptions(
        topic=topic,
        progress_topic=progress,
        transactional_id_prefix=TRANSACTIONAL_ID_PREFIX.value(options),
        sink_id=opt.SINK_ID.value(options),
        exactly_once=opt.DELIVERY_GUARANTEE.value(options) == "exactly-once",
        marker_log=MARKER_LOG_TOPIC.value(options),
        kafka=kafka,
        changes=parse_changes(options, "the eos_kafka sink"),
        transaction_timeout_ms=timeout,
        commit_mode=COMMIT_MODE.value(options),
    )


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


def transactional_id(
    options: KafkaSinkOptions,
    sink_id: str,
    partition: int,
    slot: int | None = None,
    attempt: int = 0,
) -> str:
    """``<prefix>-<sink id>-<task partition>``: stable, so a retry fences its predecessors
    (``commitMode=task``). A batch job's run in the batch commit names its own
    (``...-<task partition>r<slot>``, :mod:`.runs`), so that two runs of one version never
    fence each other; and a task attempt in the batch commit adds its attempt slot
    (``...a<attempt>``, none for slot 0: :func:`attempt_slot`), so that two live attempts
    of one task partition do not either."""
    tail = f"{partition}" if slot is None else f"{partition}r{slot}"
    if attempt:
        tail += f"a{attempt}"
    name = f"{options.transactional_id_prefix}-{sink_id}-{tail}"
    if len(name) > MAX_TRANSACTIONAL_ID:
        raise ConfigError(
            f"transactional.id {name[:40]}... is {len(name)} characters; keep "
            f"transactionalIdPrefix and sinkId under {MAX_TRANSACTIONAL_ID} together."
        )
    return name


#: How many transactional ids (attempt slots) a task partition's attempts take turns with
#: in the batch commit: what the sink leaves at the coordinators per task partition.
ATTEMPT_SLOTS = 16
_ATTEMPT = re.compile(r"a[0-9]+$")


def attempt_slot(task_attempt_id: int) -> int:
    """Task: the batch commit's attempt slot of the task attempt ``task_attempt_id``
    (Spark's, unique within the application): two live attempts of one task partition
    (a stage resubmitted while its first attempt still runs, a speculative copy) get
    different slots unless their ids are equal modulo :data:`ATTEMPT_SLOTS`."""
    return task_attempt_id % ATTEMPT_SLOTS


def marker_group(transactional_id: str) -> str:
    """The marker group a transactional id's transactions commit their offset to: the id
    without its attempt slot, so every attempt of a task partition (of a run) marks one
    group."""
    return _ATTEMPT.sub("", transactional_id)


def ids_prefix(options: KafkaSinkOptions, sink_id: str) -> str:
    """What the sink's transactional ids start with, before the task partition."""
    return transactional_id(options, sink_id, 0)[:-1]
