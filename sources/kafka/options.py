"""Options of the ``eos_kafka`` source, named as Spark's built-in ``kafka`` source names them.

They are parsed once, on the driver, into a frozen :class:`KafkaSourceOptions`;
anything unknown, malformed or contradictory is a :class:`ConfigError` naming
the option.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from eos_connectors.core import options as opt
from eos_connectors.core.errors import ConfigError

EARLIEST = -2
LATEST = -1

Subscription = Literal["subscribe", "subscribePattern", "assign"]

# Spark options this source understands (keys compared case-insensitively).
_KNOWN = {
    "subscribe",
    "subscribepattern",
    "assign",
    "startingoffsets",
    "startingoffsetsbytimestamp",
    "startingtimestamp",
    "startingoffsetsbytimestampstrategy",
    "maxoffsetspertrigger",
    "minpartitions",
    "maxpartitions",
    "failondataloss",
    "includeheaders",
    "kafkaconsumer.polltimeoutms",
    "groupidprefix",
    "publishoffsetstogroup",
    "minoffsetspertrigger",
    "maxtriggerdelay",
    "maxrecordsperpartition",
    "fetchoffset.numretries",
    "fetchoffset.retryintervalms",
    "endingoffsets",
    "endingoffsetsbytimestamp",
    "endingtimestamp",
}


# Consumer settings the source owns: a user value would break replay or offsets.
_OWNED_KAFKA = {
    "kafka.enable.auto.commit": "offsets live in Spark's checkpoint, never in a group",
    "kafka.auto.offset.reset": "use startingOffsets",
    "kafka.enable.auto.offset.store": "offsets live in Spark's checkpoint",
    "kafka.key.deserializer": "keys are returned as bytes; cast in Spark",
    "kafka.value.deserializer": "values are returned as bytes; cast in Spark",
}

_ISOLATION_LEVELS = {"read_committed", "read_uncommitted"}


@dataclass(frozen=True)
class KafkaSourceOptions:
    bootstrap_servers: str
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
    poll_timeout_ms: int = 120_000
    group_id_prefix: str = "eos-kafka-source"
    publish_group: str | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    max_records_per_partition: int | None = None
    fetch_offset_retries: int = 3
    fetch_offset_retry_interval_ms: int = 1000
    group_id: str | None = None  # kafka.group.id: the consumers' group (never committed to)
    kafka: dict[str, str] = field(default_factory=dict, repr=False)  # may hold sasl.password

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
            "bootstrap.servers": self.bootstrap_servers,
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


def _max_partitions(options: Mapping[str, str]) -> int | None:
    """``maxPartitions``: at most this many read tasks a batch; not below ``minPartitions``."""
    most = _positive_int(options, "maxPartitions")
    least = _positive_int(options, "minPartitions")
    if most is not None and least is not None and least > most:
        raise ConfigError(
            f"Option 'minPartitions' ({least}) is above 'maxPartitions' ({most}): a batch cannot "
            "have at least that many tasks and at most this many. Lower minPartitions or raise "
            "maxPartitions."
        )
    return most


def parse_options(raw: Mapping[str, str]) -> KafkaSourceOptions:
    """Parse Spark's string options into a frozen config; raise ConfigError on bad input."""
    options = {k.lower(): v for k, v in raw.items() if k.lower() not in opt.SPARK_WRITER_OPTIONS}
    _reject_unknown(options)
    kafka = _kafka_settings(raw)
    bootstrap = kafka.pop("bootstrap.servers", "")
    if not bootstrap:
        raise ConfigError("Option 'kafka.bootstrap.servers' is required (host:port[,host:port]).")
    subscription, topics, pattern, assigned = _subscription(options)
    return KafkaSourceOptions(
        bootstrap_servers=bootstrap,
        subscription=subscription,
        topics=topics,
        pattern=pattern,
        assigned=assigned,
        starting_offsets=_offsets_spec(options, "startingOffsets"),
        starting_timestamps=_timestamps(options, "startingTimestamp", "startingOffsetsByTimestamp"),
        ending_offsets=_offsets_spec(options, "endingOffsets"),
        ending_timestamps=_timestamps(options, "endingTimestamp", "endingOffsetsByTimestamp"),
        timestamp_strategy=opt.choice(
            options, "startingOffsetsByTimestampStrategy", ("error", "latest"), "error"
        ),  # type: ignore[arg-type]
        max_offsets_per_trigger=_positive_int(options, "maxOffsetsPerTrigger"),
        min_partitions=_positive_int(options, "minPartitions"),
        max_partitions=_max_partitions(options),
        fail_on_data_loss=opt.boolean(options, "failOnDataLoss", True),
        include_headers=opt.boolean(options, "includeHeaders", False),
        poll_timeout_ms=_positive_int(options, "kafkaConsumer.pollTimeoutMs") or 120_000,
        group_id_prefix=options.get("groupidprefix", "eos-kafka-source"),
        publish_group=options.get("publishoffsetstogroup") or None,
        min_offsets_per_trigger=_positive_int(options, "minOffsetsPerTrigger"),
        max_trigger_delay_ms=_duration_ms(options, "maxTriggerDelay", "15m"),
        max_records_per_partition=_positive_int(options, "maxRecordsPerPartition"),
        fetch_offset_retries=_int(
            options.get("fetchoffset.numretries", "3"), "fetchOffset.numRetries", minimum=0
        ),
        fetch_offset_retry_interval_ms=_int(
            options.get("fetchoffset.retryintervalms", "1000"),
            "fetchOffset.retryIntervalMs",
            minimum=0,
        ),
        group_id=kafka.pop("group.id", None),
        kafka=kafka,
    )


def _reject_unknown(options: Mapping[str, str]) -> None:
    for key in options:
        if not key.startswith("kafka.") and key not in _KNOWN:
            known = ", ".join(sorted(_KNOWN))
            raise ConfigError(
                f"Unknown option '{key}' for eos_kafka. Known options: {known}, kafka.*"
            )


def _kafka_settings(raw: Mapping[str, str]) -> dict[str, str]:
    settings = opt.kafka_settings(raw, _OWNED_KAFKA)
    level = settings.get("isolation.level", "read_committed")
    if level not in _ISOLATION_LEVELS:
        raise ConfigError(
            "Option 'kafka.isolation.level' must be read_committed or read_uncommitted, "
            f"got {level!r}."
        )
    return settings


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


def check_for_stream(options: KafkaSourceOptions) -> None:
    """Driver: options only a batch read takes are refused in a stream, as Spark does."""
    if options.ending_offsets is not None or options.ending_timestamps is not None:
        raise ConfigError(
            "Options 'endingOffsets', 'endingOffsetsByTimestamp' and 'endingTimestamp' apply "
            "to batch reads (spark.read.format('eos_kafka')); a stream reads on. Drop them, "
            "or read the range as a batch."
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
            if not isinstance(value, int) or value < minimum:
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
    try:
        number = int(value)
    except ValueError as exc:
        raise ConfigError(f"Option '{option}' must be an integer, got {value!r}.") from exc
    if number < minimum:
        raise ConfigError(f"Option '{option}' must be >= {minimum}, got {number}.")
    return number


_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _duration_ms(options: Mapping[str, str], name: str, default: str) -> int:
    """A duration as Spark's options write it (``15m``, ``30s``, ``500ms``; a bare number
    is milliseconds), in milliseconds."""
    value = options.get(name.lower(), default)
    found = _DURATION.match(value)
    if found is None:
        raise ConfigError(
            f"Option '{name}' must be a duration such as 30s, 15m or 500ms, got {value!r}."
        )
    return int(found.group(1)) * _UNIT_MS[(found.group(2) or "ms").lower()]


def _positive_int(options: Mapping[str, str], name: str) -> int | None:
    value = options.get(name.lower())
    return None if value is None else _int(value, name, minimum=1)
