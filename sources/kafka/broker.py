"""Driver-side questions to the brokers: which partitions, and which offsets.

Every call is bounded in time; a broker that does not answer is a
:class:`ServiceUnavailableError` naming ``kafka.bootstrap.servers``, never a hang.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from confluent_kafka import (
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from eos_connectors.core.errors import ConfigError, EosError, ServiceUnavailableError, keeping_code
from eos_connectors.core.kafka_config import logged
from eos_connectors.core.kafka_errors import (
    ClientErrors,
    error_code,
    leader_moving,
    no_leader_known,
)
from eos_connectors.sources.kafka.offsets import Offsets, TopicPartitionKey
from eos_connectors.sources.kafka.options import EARLIEST, LATEST, KafkaSourceOptions

log = logging.getLogger(__name__)

NO_TOPIC_ID = "AAAAAAAAAAAAAAAAAAAAAA"  # the all-zero id of brokers that keep none

T = TypeVar("T")

FIRST_BACKOFF_S = 0.05
MAX_BACKOFF_S = 1.0
PROBE_TIMEOUT_S = 5.0
LOG_ENDS = (type(OffsetSpec.latest()), type(OffsetSpec.earliest()))


class BrokerView:
    """Metadata and offset look-ups for one source, through one lazily made AdminClient."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        # one request: at most half the time a look-up may take, leaving time to ask again
        self.timeout = min(30.0, options.poll_timeout_ms / 2000)
        # Asking again while leaders move, as the tasks do: one broker of a replicated
        # cluster killed twice in a row kept a partition's leader away for over 30 s
        # (each death is noticed after broker.session.timeout.ms, 9 s by default).
        self.moving_limit = max(self.timeout, options.poll_timeout_ms / 1000)
        self._admin: AdminClient | None = None
        self._errors = ClientErrors()

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self._errors.watching(logged(self.options.client_config())))
        return self._admin

    def partitions(self) -> list[TopicPartitionKey]:
        """The subscription's partitions as the brokers know them now."""
        topics = self._topics()
        if self.options.subscription == "assign":
            return self._check_assigned(topics)
        found = [
            (name, p)
            for name, parts in topics.items()
            if not name.startswith("__") and self.options.matches(name)
            for p in parts
        ]
        if not found:
            log.warning("eos_kafka: no topic matches the subscription yet; waiting for one.")
        return sorted(found)

    def latest(self, tps: Iterable[TopicPartitionKey]) -> Offsets:
        """End offsets: the last stable offset under read_committed, else the high watermark."""
        return self._list_offsets({tp: OffsetSpec.latest() for tp in tps})

    def earliest(self, tps: Iterable[TopicPartitionKey]) -> Offsets:
        return self._list_offsets({tp: OffsetSpec.earliest() for tp in tps})

    def for_times(self, times: Mapping[TopicPartitionKey, int]) -> dict[TopicPartitionKey, int]:
        """First offset with a timestamp >= the given one; -1 where there is none."""
        return self._list_offsets({tp: OffsetSpec.for_timestamp(ts) for tp, ts in times.items()})

    def topic_ids(self, topics: Iterable[str]) -> dict[str, str]:
        """Each topic's id, which changes when a topic is deleted and created again.

        A topic that vanished since it was listed is left out; a broker older
        than Kafka 2.8 gives no ids, and then only offsets that go back reveal
        a recreated topic.
        """
        ids = {}
        for name, description in self._describe(topics).items():
            topic_id = description.topic_id
            if topic_id is not None and str(topic_id) != NO_TOPIC_ID:
                ids[name] = str(topic_id)
        return ids

    def missing_topics(self, topics: Iterable[str]) -> set[str]:
        """Of ``topics``, those the brokers say do not exist (a topic they cannot describe
        now for another reason raises instead)."""
        names = set(topics)
        return names - set(self._describe(names))

    def _describe(self, topics: Iterable[str]) -> dict[str, Any]:
        """The named topics' descriptions (partitions, id); topics that do not exist are
        left out. Never creates a topic, whatever the brokers' auto-creation setting."""
        names = sorted(set(topics))
        if not names:
            return {}
        return self._asking_again("describe topics", lambda: self._described(names))

    def _described(self, names: list[str]) -> dict[str, Any]:
        futures = self.admin.describe_topics(TopicCollection(names), request_timeout=self.timeout)
        found = {}
        for name, future in futures.items():
            try:
                found[name] = future.result(timeout=self.timeout)
            except KafkaException as exc:
                if not _unknown_topic(exc):
                    raise
        return found

    def _asking_again(self, what: str, call: Callable[[], T]) -> T:
        """Driver: ``call()``, asked again with a new admin client (fresh metadata) while
        a leader moves or a broker has gone (one of a replicated cluster died), backing
        off, within ``kafkaConsumer.pollTimeoutMs``; any other failure at once."""
        began = time.monotonic()
        backoff = FIRST_BACKOFF_S
        while True:
            try:
                return call()
            except (KafkaException, TimeoutError) as exc:
                again = leader_moving(exc) or self._broker_gone(exc)
                if not again or time.monotonic() + backoff > began + self._bound(exc):
                    raise keeping_code(self._unavailable(what, exc, began), exc) from None
                log.info("eos_kafka: %s: %s; asking again", what, exc)
                self._admin = None
            time.sleep(backoff)
            backoff = min(2 * backoff, MAX_BACKOFF_S)

    def initial(
        self, tps: list[TopicPartitionKey] | None = None, default: str = "latest"
    ) -> Offsets:
        """Resolve ``startingOffsets`` / ``startingOffsetsByTimestamp`` into real offsets
        (``default`` when neither is given: a stream's "latest", a batch's "earliest")."""
        tps = self.partitions() if tps is None else tps
        if self.options.starting_timestamps is not None:
            return self._by_time(
                tps, self.options.starting_timestamps, "startingOffsetsByTimestamp"
            )
        return self._specific(tps, self.options.starting_offsets or default, "startingOffsets")

    def ending(self, tps: list[TopicPartitionKey]) -> Offsets:
        """Resolve ``endingOffsets`` / ``endingOffsetsByTimestamp`` (a batch read's end;
        "latest" when neither is given). A partition with no record at or after its
        ending timestamp ends at its latest offset, as in Spark."""
        stamps = self.options.ending_timestamps
        if stamps is not None:
            return self._by_time(tps, stamps, "endingOffsetsByTimestamp", ending=True)
        return self._specific(tps, self.options.ending_offsets or "latest", "endingOffsets")

    def _specific(
        self,
        tps: list[TopicPartitionKey],
        spec: str | Mapping[str, Mapping[int, int]],
        option: str,
    ) -> Offsets:
        if spec == "earliest":
            return self.earliest(tps)
        if spec == "latest":
            return self.latest(tps)
        assert isinstance(spec, Mapping)
        given = {(t, p): o for t, parts in spec.items() for p, o in parts.items()}
        missing = sorted(set(tps) - set(given))
        if missing:
            raise ConfigError(
                f"Option '{option}' must give an offset for every partition of the "
                f"subscription; missing: {_names(missing)} (use -2 for earliest, -1 for latest)."
            )
        unknown = sorted(set(given) - set(tps))
        if unknown:
            raise ConfigError(f"Option '{option}' names unknown partitions: {_names(unknown)}.")
        earliest = self.earliest(tp for tp, o in given.items() if o == EARLIEST)
        latest = self.latest(tp for tp, o in given.items() if o == LATEST)
        return {tp: earliest.get(tp, latest.get(tp, o)) for tp, o in given.items()}

    def _by_time(
        self,
        tps: list[TopicPartitionKey],
        stamps: Mapping[str, Mapping[int, int]] | int,
        option: str,
        ending: bool = False,
    ) -> Offsets:
        if isinstance(stamps, int):
            times = dict.fromkeys(tps, stamps)
        else:
            times = {(t, p): ts for t, parts in stamps.items() for p, ts in parts.items()}
            missing = sorted(set(tps) - set(times))
            if missing:
                raise ConfigError(
                    f"Option '{option}' must give a timestamp for every partition of the "
                    f"subscription; missing: {_names(missing)}."
                )
        found = self.for_times(times)
        absent = sorted(tp for tp, offset in found.items() if offset < 0)
        if absent and not ending and self.options.timestamp_strategy == "error":
            raise ConfigError(
                f"No record at or after the starting timestamp in {_names(absent)}; set "
                "startingOffsetsByTimestampStrategy=latest to start those at the end."
            )
        latest = self.latest(absent)
        return {tp: latest.get(tp, offset) for tp, offset in found.items()}

    def _topics(self) -> dict[str, list[int]]:
        """The partitions of each topic the subscription may read. Topics named by
        ``subscribe`` or ``assign`` are described alone; only a pattern needs the
        cluster's whole topic list (at 1,600 topics that request took 15 ms against
        0.6 ms for one topic, and ``latestOffset`` asks every batch)."""
        named = self.options.named_topics()
        if named:
            described = self._describe(named)
            return {name: sorted(p.id for p in d.partitions) for name, d in described.items()}
        metadata = self._asking_again(
            "list topics", lambda: self.admin.list_topics(timeout=self.timeout)
        )
        return {
            name: sorted(meta.partitions)
            for name, meta in metadata.topics.items()
            if meta.error is None
        }

    def _check_assigned(self, topics: Mapping[str, list[int]]) -> list[TopicPartitionKey]:
        for topic, partition in self.options.assigned:
            if topic not in topics:
                raise EosError(
                    f"Option 'assign' names topic {topic!r}, which does not exist on "
                    f"{self.options.bootstrap_servers}. Create it first."
                )
            if partition not in topics[topic]:
                raise EosError(
                    f"Option 'assign' names partition {partition} of {topic!r}, which has "
                    f"partitions {topics[topic]}."
                )
        return list(self.options.assigned)

    def _list_offsets(self, specs: Mapping[TopicPartitionKey, Any]) -> Offsets:
        if not specs:
            return {}
        isolation = (
            IsolationLevel.READ_COMMITTED
            if self.options.read_committed
            else IsolationLevel.READ_UNCOMMITTED
        )
        request = {TopicPartition(t, p): spec for (t, p), spec in specs.items()}
        began = time.monotonic()
        backoff = FIRST_BACKOFF_S
        retries = self.options.fetch_offset_retries
        while True:
            try:
                futures = self.admin.list_offsets(
                    request, isolation_level=isolation, request_timeout=self.timeout
                )
                found = {
                    (tp.topic, tp.partition): int(future.result(timeout=self.timeout).offset)
                    for tp, future in futures.items()
                }
                unanswered = sorted(
                    tp for tp, spec in specs.items() if _unanswered(found[tp], spec)
                )
                if not unanswered:
                    return found
                raise NoOffsetError(unanswered)
            except (KafkaException, TimeoutError, NoOffsetError) as exc:
                moving = isinstance(exc, NoOffsetError) or leader_moving(exc)
                moving = moving or no_leader_known(exc) or self._broker_gone(exc)  # may probe
                wait = self._retry_wait(exc, moving, backoff, retries, began + self._bound(exc))
                if wait is None:
                    raise keeping_code(self._unavailable("list offsets", exc, began), exc) from None
                if moving:
                    # librdkafka's admin client may go on sending the leader epoch it
                    # cached before the leader moved, and be refused for it until the
                    # time bound (seen on a 3-broker cluster with one broker killed): a
                    # new client starts from fresh metadata
                    self._admin = None
                else:
                    retries -= 1
            time.sleep(wait)
            backoff = min(2 * backoff, MAX_BACKOFF_S)

    def _retry_wait(
        self, exc: BaseException, moving: bool, backoff: float, retries: int, deadline: float
    ) -> float | None:
        """How long to wait before asking for offsets again, None to give up: a leader
        that is moving is asked again, backing off, until ``kafkaConsumer.pollTimeoutMs``;
        any other retriable error ``fetchOffset.numRetries`` times,
        ``fetchOffset.retryIntervalMs`` apart (Spark's source's options), within one
        request's time limit. ``moving``: a leader moves or a broker is gone."""
        if moving and time.monotonic() + backoff <= deadline:
            log.info("eos_kafka: a partition's leader is moving (%s); asking again.", exc)
            return backoff
        retriable = isinstance(exc, KafkaException) and exc.args[0].retriable()
        interval = self.options.fetch_offset_retry_interval_ms / 1000
        if retriable and retries > 0 and time.monotonic() + interval <= deadline:
            log.info("eos_kafka: looking offsets up failed (%s); asking again.", exc)
            return interval
        return None

    def _bound(self, exc: BaseException) -> float:
        """How long a look-up may go on asking: ``kafkaConsumer.pollTimeoutMs`` while some
        broker answers (a leader moving, one broker gone), one request's limit when none
        does (a wrong address, a cluster that is down, fails as fast as before)."""
        code = error_code(exc)
        return self.timeout if code == KafkaError._ALL_BROKERS_DOWN else self.moving_limit

    def _broker_gone(self, exc: BaseException) -> bool:
        """A broker went away (not: the brokers refused this client, which the error
        callbacks served now would say)."""
        if self._admin is not None:
            self._admin.poll(0)
        if self._errors.broker_gone(exc):
            return True
        return self._errors.timed_out_on_lost_broker(exc) and self._some_broker_answers()

    def _some_broker_answers(self) -> bool:
        """Whether a broker answers a metadata request now (a new client, so that a dead
        broker its metadata names is not the one asked). On a replicated cluster an admin
        request waits for the broker the metadata named controller: killed, it times the
        request out although the other brokers answer (seen when the harness killed a
        transaction coordinator that was also that broker)."""
        probe = AdminClient(self._errors.watching(logged(self.options.client_config())))
        try:
            probe.list_topics(timeout=min(PROBE_TIMEOUT_S, self.timeout))
        except KafkaException:
            return False
        return True

    def _unavailable(self, what: str, exc: BaseException, began: float) -> ServiceUnavailableError:
        """The error for a failed look-up asked since ``began``, with the broker's reason (an
        authentication failure reads as one); the client settings' secrets redacted."""
        reason = self._errors.reason(self.admin, exc)
        asked = time.monotonic() - began
        return ServiceUnavailableError(
            f"Kafka at {self.options.bootstrap_servers} (option 'kafka.bootstrap.servers') did "
            f"not answer '{what}' in {asked:.0f} s: {reason}. "
            "Check that the brokers run and are reachable, and the kafka.security.protocol and "
            "kafka.sasl.* options; raise kafkaConsumer.pollTimeoutMs for slow clusters."
        )


class NoOffsetError(ServiceUnavailableError):
    """Driver: librdkafka answered a look-up without an offset for some partitions and
    without an error (seen as -1001 for a partition whose leader had just been killed
    on a 3-broker cluster): asked again like a leader that moves, never used."""

    def __init__(self, partitions: list[TopicPartitionKey]) -> None:
        named = ", ".join(f"{topic}-{partition}" for topic, partition in partitions)
        super().__init__(f"no offset for {named} (a leader is moving)")


def _unanswered(offset: int, spec: Any) -> bool:
    """Not an offset: below 0 for the log's start or end; for a timestamp, -1 says no
    record at or after it (Kafka's answer), anything else below 0 is none."""
    if type(spec) in LOG_ENDS:
        return offset < 0
    return offset < -1


def _unknown_topic(exc: BaseException) -> bool:
    """A topic deleted between listing and describing it."""
    return (
        isinstance(exc, KafkaException) and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    )


def _names(tps: Iterable[TopicPartitionKey]) -> str:
    return ", ".join(f"{t}-{p}" for t, p in tps)
