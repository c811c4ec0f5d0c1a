"""Options of the ``eos_kafka`` source, named as Spark's built-in ``kafka`` source names them.

They are parsed once, on the driver, into a frozen :class:`KafkaSourceOptions`;
anything unknown, malformed or contradictory is a :class:`ConfigError` naming
the option.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from eos_connectors.core import kafka_config
from eos_connectors.core import options as opt
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.spark_api import HAS_READ_LIMITS, release

EARLIEST = -2
LATEST = -1

Subscription = Literal["subscribe", "subscribePattern", "assign"]

DEFAULT_POLL_TIMEOUT_MS = 120_000
log = logging.getLogger(__name__)

DEFAULT_GROUP_ID_PREFIX = "eos-kafka-source"
_ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
_STREAM, _BATCH = opt.Applies.STREAM, opt.Applies.BATCH


def _as_given(value: str, _name: str) -> str:
    return value


OPTIONS = opt.OptionTable(
    "eos_kafka",
    [
        opt.Option(
            "kafka.bootstrap.servers",
            opt.required_text,
            "the brokers, `host:port[,host:port]` (required)",
        ),
        opt.Option(
            "subscribe",
            _as_given,
            "comma-separated topics; exactly one of `subscribe`, `subscribePattern`, `assign`",
        ),
        opt.Option(
            "subscribePattern",
            _as_given,
            "a regex of topics; new matching topics are picked up between batches",
        ),
        opt.Option(
            "assign", _as_given, 'JSON `{"t": [0, 1]}`: these partitions (the topics must exist)'
        ),
        opt.Option(
            "startingOffsets",
            _as_given,
            "`latest` (a stream's default), `earliest` (a batch read's default), or JSON "
            '`{"t": {"0": 23, "1": -2}}` with -2 earliest, -1 latest, every partition named; a '
            "batch read cannot start at latest",
            default_doc="`latest` / `earliest`",
        ),
        opt.Option(
            "startingOffsetsByTimestamp",
            _as_given,
            'JSON `{"t": {"0": 1700000000000}}`: the first offset at or after a timestamp (ms) '
            "per partition",
        ),
        opt.Option(
            "startingTimestamp",
            opt.integer(0),
            "the first offset at or after this timestamp (ms), for every partition",
        ),
        opt.Option(
            "startingOffsetsByTimestampStrategy",
            opt.choice("error", "latest"),
            "when no offset is at or after the starting timestamp: `error` or `latest`",
            default="error",
        ),
        opt.Option(
            "endingOffsets",
            _as_given,
            '`latest` or JSON `{"t": {"0": 50, "1": -1}}`, every partition named; cannot be '
            "earliest (-2). A stream refuses it, as Spark's does",
            default_doc="`latest`",
            applies=_BATCH,
        ),
        opt.Option(
            "endingOffsetsByTimestamp",
            _as_given,
            "end below the first offset at or after a timestamp (ms), per partition; a "
            "partition with no such record ends at its latest offset",
            applies=_BATCH,
        ),
        opt.Option(
            "endingTimestamp",
            opt.integer(0),
            "as `endingOffsetsByTimestamp`, one timestamp (ms) for every partition",
            applies=_BATCH,
        ),
        opt.Option(
            "maxOffsetsPerTrigger",
            opt.integer(1),
            "read limit per batch, shared over partitions by backlog (Spark's `ReadLimit`; "
            "`Trigger.AvailableNow` is supported); a batch read ignores it with a warning. "
            "PySpark 4.2+, or see `legacyReadLimits`",
            applies=_STREAM,
        ),
        opt.Option(
            "minOffsetsPerTrigger",
            opt.integer(1),
            "plan no batch while fewer new offsets than this are there, up to "
            "`maxTriggerDelay` since the last batch; not under `Trigger.AvailableNow`",
            applies=_STREAM,
        ),
        opt.Option(
            "maxTriggerDelay",
            opt.duration_ms,
            "with `minOffsetsPerTrigger`: the longest wait for a batch (`30s`, `15m`, ...)",
            default=15 * 60 * 1000,
            default_doc="`15m`",
            applies=_STREAM,
        ),
        opt.Option(
            "legacyReadLimits",
            opt.boolean,
            "PySpark 4.0-4.1 only (which give a Python source no read limit): `true` lets the "
            "source apply `maxOffsetsPerTrigger`, `minOffsetsPerTrigger` and `maxTriggerDelay` "
            "itself, exactly under a `processingTime` trigger; Spark runs `availableNow` as "
            "one batch there, so never with `availableNow`. Ignored on 4.2+",
            default=False,
            applies=_STREAM,
        ),
        opt.Option(
            "minPartitions",
            opt.integer(1),
            "split large ranges so a batch has at least this many tasks (recorded with each "
            "batch, so a replay is split as it first was)",
        ),
        opt.Option(
            "maxPartitions",
            opt.integer(1),
            "read a batch with at most this many tasks, packing several partitions' ranges "
            "into one task (recorded with each batch). Not in Spark's own source: a Python "
            "task costs Spark more than a JVM one, so with more partitions than task slots, "
            "set it to the slots",
        ),
        opt.Option(
            "maxRecordsPerPartition",
            opt.integer(1),
            "split ranges so that no task reads more offsets than this (recorded with each batch)",
        ),
        opt.Option(
            "failOnDataLoss",
            opt.boolean,
            "`true`: records lost before they were read fail the query, naming topic, "
            "partition and offsets; `false`: a warning naming the same, and the query reads on "
            "(see [data loss](#data-loss-never-a-silent-skip))",
            default=True,
        ),
        opt.Option(
            "includeHeaders",
            opt.boolean,
            "add `headers: array<struct<key string, value binary>>`",
            default=False,
        ),
        opt.Option(
            "kafkaConsumer.pollTimeoutMs",
            opt.integer(1),
            "bound on any broker call and on a read without progress; an unreachable broker is "
            "a clear error, not a hang. Offset look-ups of a partition whose leader is moving "
            "are asked again, backing off, within this bound",
            default=DEFAULT_POLL_TIMEOUT_MS,
        ),
        opt.Option(
            "fetchOffset.numRetries",
            opt.integer(0),
            "retries of a failed offset look-up; a partition whose leader is moving is asked "
            "again within `kafkaConsumer.pollTimeoutMs` regardless",
            default=3,
        ),
        opt.Option(
            "fetchOffset.retryIntervalMs",
            opt.integer(0),
            "milliseconds between those retries",
            default=1000,
        ),
        opt.Option(
            "kafka.group.id",
            opt.required_text,
            "the group id of the source's consumers, as given (the source assigns partitions "
            "and never commits to it)",
        ),
        opt.Option(
            "groupIdPrefix",
            _as_given,
            "prefix of the source's private consumer group ids (when `kafka.group.id` is not set)",
            default=DEFAULT_GROUP_ID_PREFIX,
        ),
        opt.Option(
            "publishOffsetsToGroup",
            opt.required_text,
            "commit the end offsets of each completed batch to this consumer group, so "
            "standard Kafka tools show lag; never read back. Not in Spark's own source. On "
            "PySpark 4.0-4.1 Spark tells a source that a batch completed only when it plans "
            "the next, so each batch is published at the next trigger, and an "
            "`availableNow` run (one batch there) publishes nothing",
            applies=_STREAM,
        ),
        opt.Option(
            "kafka.isolation.level",
            opt.choice(*_ISOLATION_LEVELS),
            "`read_committed` (Spark's source reads uncommitted) or `read_uncommitted`",
            default="read_committed",
        ),
        *(
            opt.Option(name, _as_given, "", refused=reason)
            for name, reason in (
                (
                    "kafka.enable.auto.commit",
                    "offsets live in Spark's checkpoint, never in a group",
                ),
                ("kafka.auto.offset.reset", "use startingOffsets"),
                ("kafka.enable.auto.offset.store", "offsets live in Spark's checkpoint"),
                ("kafka.key.deserializer", "keys are returned as bytes; cast in Spark"),
                ("kafka.value.deserializer", "values are returned as bytes; cast in Spark"),
            )
        ),
    ],
    passthrough=("kafka.",),
)


@dataclass(frozen=True)
class KafkaSourceOptions:
    subscription: Subscription
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assigned: tuple[tuple[str, int], ...] = ()
    #: None when not given: a stream starts at "latest", a batch read at "earliest"
    starting_offsets: str | dict[str, dict[int, int]] | None = None
    starting_timestamps: dict[str, dict[int, int]] | int | None = None
    #: batch reads only: where they end (None: "latest", unless ending_timestamps)
    ending_offsets: str | dict[str, dict[int, int]] | None = None
    ending_timestamps: dict[str, dict[int, int]] | int | None = None
    timestamp_strategy: Literal["error", "latest"] = "error"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    max_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    group_id_prefix: str = DEFAULT_GROUP_ID_PREFIX
    publish_group: str | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    max_records_per_partition: int | None = None
    legacy_read_limits: bool = False  # PySpark 4.0-4.1: the reader applies the read limits
    fetch_offset_retries: int = 3
    fetch_offset_retry_interval_ms: int = 1000
    group_id: str | None = None  # kafka.group.id: the consumers' group (never committed to)
    #: librdkafka's settings (bootstrap.servers among them, not group.id); may hold a password
    kafka: dict[str, str] = field(default_factory=dict, repr=False)

    @property
    def bootstrap_servers(self) -> str:
        return kafka_config.bootstrap(self.kafka)

    @property
    def isolation_level(self) -> str:
        return self.kafka.get("isolation.level", "read_committed")

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings for every client the source makes."""
        return {
            **self.kafka,
            "isolation.level": self.isolation_level,
            "log_level": int(self.kafka.get("log_level", "3")),
        }

    def named_topics(self) -> tuple[str, ...]:
        """The topics ``subscribe`` or ``assign`` name; () for ``subscribePattern``."""
        if self.subscription == "subscribe":
            return self.topics
        return tuple(dict.fromkeys(t for t, _ in self.assigned))

    def matches(self, topic: str) -> bool:
        """True when ``topic`` belongs to the subscription (pattern or list)."""
        if self.subscription == "subscribe":
            return topic in self.topics
        if self.subscription == "subscribePattern":
            return self.pattern is not None and re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assigned)


def parse_options(raw: Mapping[str, str]) -> KafkaSourceOptions:
    """Driver: Spark's string options as a frozen config; ConfigError on bad input."""
    options = OPTIONS.lowered(raw)
    values = {option.key: option.value(options) for option in OPTIONS.options}
    kafka = kafka_config.from_options(raw, {})
    kafka["isolation.level"] = values["kafka.isolation.level"]
    group_id = kafka.pop("group.id", None)
    subscription, topics, pattern, assigned = _subscription(options)
    fewest, most_offsets = values["minoffsetspertrigger"], values["maxoffsetspertrigger"]
    if fewest is not None and most_offsets is not None and fewest > most_offsets:
        raise ConfigError(
            f"Option 'minOffsetsPerTrigger' ({fewest}) is above 'maxOffsetsPerTrigger' "
            f"({most_offsets}): a batch cannot wait for more records than it may take (Spark's "
            "kafka source refuses it too). Lower minOffsetsPerTrigger or raise "
            "maxOffsetsPerTrigger."
        )
    least, most = values["minpartitions"], values["maxpartitions"]
    if most is not None and least is not None and least > most:
        raise ConfigError(
            f"Option 'minPartitions' ({least}) is above 'maxPartitions' ({most}): a batch cannot "
            "have at least that many tasks and at most this many. Lower minPartitions or raise "
            "maxPartitions."
        )
    return KafkaSourceOptions(
        subscription=subscription,
        topics=topics,
        pattern=pattern,
        assigned=assigned,
        starting_offsets=_offsets_spec(options, "startingOffsets"),
        starting_timestamps=_timestamps(options, "startingTimestamp", "startingOffsetsByTimestamp"),
        ending_offsets=_offsets_spec(options, "endingOffsets"),
        ending_timestamps=_timestamps(options, "endingTimestamp", "endingOffsetsByTimestamp"),
        timestamp_strategy=values["startingoffsetsbytimestampstrategy"],
        max_offsets_per_trigger=values["maxoffsetspertrigger"],
        min_partitions=least,
        max_partitions=most,
        fail_on_data_loss=values["failondataloss"],
        include_headers=values["includeheaders"],
        poll_timeout_ms=values["kafkaconsumer.polltimeoutms"],
        group_id_prefix=values["groupidprefix"],
        publish_group=values["publishoffsetstogroup"],
        min_offsets_per_trigger=values["minoffsetspertrigger"],
        max_trigger_delay_ms=values["maxtriggerdelay"],
        max_records_per_partition=values["maxrecordsperpartition"],
        legacy_read_limits=values["legacyreadlimits"],
        fetch_offset_retries=values["fetchoffset.numretries"],
        fetch_offset_retry_interval_ms=values["fetchoffset.retryintervalms"],
        group_id=group_id,
        kafka=kafka,
    )


def _subscription(
    options: Mapping[str, str],
) -> tuple[Subscription, tuple[str, ...], str | None, tuple[tuple[str, int], ...]]:
    given = [name for name in ("subscribe", "subscribepattern", "assign") if options.get(name)]
    if len(given) != 1:
        found = ", ".join(given) if given else "none"
        raise ConfigError(
            "Exactly one of the options 'subscribe', 'subscribePattern' or 'assign' must be set "
            f"(found: {found})."
        )
    name = given[0]
    value = options[name]
    if name == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise ConfigError("Option 'subscribe' must name at least one topic.")
        return "subscribe", topics, None, ()
    if name == "subscribepattern":
        try:
            re.compile(value)
        except re.error as exc:
            raise ConfigError(f"Option 'subscribePattern' is not a valid regex: {exc}.") from exc
        return "subscribePattern", (), value, ()
    return "assign", (), None, _assignment(value)


def _assignment(value: str) -> tuple[tuple[str, int], ...]:
    parsed = _json(value, "assign", 'like {"topicA": [0, 1], "topicB": [2]}')
    pairs: list[tuple[str, int]] = []
    if not isinstance(parsed, dict) or not parsed:
        raise ConfigError("Option 'assign' must be a JSON object like {\"topicA\": [0, 1]}.")
    for topic, partitions in parsed.items():
        if not isinstance(partitions, list) or not all(
            isinstance(p, int) and p >= 0 for p in partitions
        ):
            raise ConfigError(
                f"Option 'assign': topic {topic!r} must map to a list of partition numbers."
            )
        pairs.extend((topic, p) for p in partitions)
    return tuple(sorted(set(pairs)))


def _offsets_spec(options: Mapping[str, str], name: str) -> str | dict[str, dict[int, int]] | None:
    """``startingOffsets`` / ``endingOffsets``: earliest, latest or per-partition JSON (-2
    earliest, -1 latest); None when not given."""
    value = options.get(name.lower())
    if value is None:
        return None
    lowered = value.strip().lower()
    if lowered in ("earliest", "latest"):
        return lowered
    parsed = _json(value, name, 'earliest, latest, or {"topic": {"0": 23}}')
    return _per_partition(parsed, name, minimum=-2)


def _timestamps(
    options: Mapping[str, str], single: str, by_partition: str
) -> dict[str, dict[int, int]] | int | None:
    """``startingTimestamp`` / ``startingOffsetsByTimestamp`` (or the ending pair): one
    timestamp for every partition, or one per partition; None when neither is given."""
    per = options.get(by_partition.lower())
    one = options.get(single.lower())
    if per and one:
        raise ConfigError(f"Set only one of '{by_partition}' and '{single}'.")
    if one:
        return _int(one, single, minimum=0)
    if per:
        parsed = _json(per, by_partition, '{"topic": {"0": 1700000000000}}')
        return _per_partition(parsed, by_partition, minimum=0)
    return None


#: Options a batch read ignores (they shape a stream's batches or its group's offsets).
STREAM_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")


def warn_ignored(raw: Mapping[str, str], options: KafkaSourceOptions, batch: bool) -> None:
    """Driver: what Spark's kafka source warns it ignores gets the same warning here:
    ``groupIdPrefix`` beside ``kafka.group.id``, and in a batch read the options that
    shape a stream's batches (and ``publishOffsetsToGroup``: a batch read publishes
    nothing)."""
    given = OPTIONS.lowered(raw)
    if options.group_id is not None and "groupidprefix" in given:
        log.warning("eos_kafka: option 'groupIdPrefix' is ignored: 'kafka.group.id' is set.")
    if not batch:
        return
    for name in (*STREAM_ONLY, "publishOffsetsToGroup"):
        if name.lower() in given:
            log.warning("eos_kafka: option %r is ignored in a batch read (streams only).", name)


#: Options that need Spark's admission control for Python sources (PySpark 4.2+).
ADMISSION_OPTIONS = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")


def check_for_stream(options: KafkaSourceOptions, given: Mapping[str, str]) -> None:
    """Driver: options only a batch read takes are refused in a stream, as Spark does;
    so are those the running PySpark cannot honour (admission control before 4.2)."""
    _check_admission(options, given)
    if options.ending_offsets is not None or options.ending_timestamps is not None:
        raise ConfigError(
            "Options 'endingOffsets', 'endingOffsetsByTimestamp' and 'endingTimestamp' apply "
            "to batch reads (spark.read.format('eos_kafka')); a stream reads on. Drop them, "
            "or read the range as a batch."
        )


def _check_admission(options: KafkaSourceOptions, given: Mapping[str, str]) -> None:
    """Before PySpark 4.2 Spark gives a Python source no read limit: a bounded batch would
    read everything, and ``availableNow`` would stop after its single batch. Refused unless
    ``legacyReadLimits`` says the trigger is ``processingTime`` and the reader bounds it."""
    if HAS_READ_LIMITS or options.legacy_read_limits:
        return
    named = {key.lower() for key in given}
    refused = [name for name in ADMISSION_OPTIONS if name.lower() in named]
    if refused:
        raise ConfigError(
            f"Option {refused[0]!r} needs PySpark 4.2 or later: PySpark {release()} gives "
            "a Python source no read limit (Spark's admission control for Python data sources "
            f"came in 4.2). Drop {', '.join(map(repr, refused))}, run PySpark 4.2+, or, with a "
            "processingTime trigger (never availableNow, which 4.0-4.1 run as one batch), set "
            "legacyReadLimits=true to have the source bound each batch itself."
        )


def check_for_batch(options: KafkaSourceOptions) -> None:
    """Driver: a batch read cannot start at "latest" nor end at "earliest" (Spark refuses
    both); its JSON bounds must name the same partitions and not cross."""
    start, end = options.starting_offsets, options.ending_offsets
    if start == "latest" or (isinstance(start, dict) and _any(start, LATEST)):
        raise ConfigError(
            "Option 'startingOffsets' cannot be latest (or -1) in a batch read: it would read "
            "nothing. Use earliest, offsets, or startingTimestamp."
        )
    if end == "earliest" or (isinstance(end, dict) and _any(end, EARLIEST)):
        raise ConfigError(
            "Option 'endingOffsets' cannot be earliest (or -2) in a batch read: it would read "
            "nothing. Use latest, offsets, or endingTimestamp."
        )
    if isinstance(start, dict) and isinstance(end, dict):
        _check_same_partitions(start, end)
        for topic, partitions in start.items():
            for partition, first in partitions.items():
                last = end[topic][partition]
                if first >= 0 and last >= 0 and first > last:
                    raise ConfigError(
                        f"Options 'startingOffsets' and 'endingOffsets': {topic}-{partition} "
                        f"starts at {first}, after its end {last}."
                    )


def _any(spec: Mapping[str, Mapping[int, int]], offset: int) -> bool:
    return any(o == offset for parts in spec.values() for o in parts.values())


def _check_same_partitions(
    start: Mapping[str, Mapping[int, int]], end: Mapping[str, Mapping[int, int]]
) -> None:
    first = {(t, p) for t, parts in start.items() for p in parts}
    last = {(t, p) for t, parts in end.items() for p in parts}
    if first != last:
        differ = ", ".join(f"{t}-{p}" for t, p in sorted(first ^ last))
        raise ConfigError(
            f"Options 'startingOffsets' and 'endingOffsets' must name the same partitions; "
            f"{differ} differ."
        )


def _per_partition(parsed: Any, option: str, minimum: int) -> dict[str, dict[int, int]]:
    if not isinstance(parsed, dict):
        raise ConfigError(f"Option '{option}' must be a JSON object of topics to partitions.")
    result: dict[str, dict[int, int]] = {}
    for topic, partitions in parsed.items():
        if not isinstance(partitions, dict):
            raise ConfigError(f"Option '{option}': topic {topic!r} must map to an object.")
        result[topic] = {}
        for partition, value in partitions.items():
            where = f"topic {topic!r} partition {partition!r}"
            part = _int(str(partition), f"{option}' ({where}", minimum=0)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(
                    f"Option '{option}': {where} must be an integer >= {minimum}, got {value!r}."
                )
            result[topic][part] = value
    return result


def _json(value: str, option: str, example: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"Option '{option}' is not valid JSON ({exc.msg}); expected {example}."
        ) from exc


def _int(value: str, option: str, minimum: int) -> int:
    parsed: int = opt.integer(minimum)(value, option)
    return parsed
