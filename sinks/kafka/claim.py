"""The Kafka sink's claim on its sink id, taken before a task writes anything.

Each task partition's progress marker names the query that wrote it, so a second
query with the same ``sinkId`` is refused where the first one wrote. A task
partition the first query never wrote has no marker, though, and would commit.
So a task whose marker names no query yet (the first batch of a task partition,
or the first after ``eos sinks reset``) first makes sure the sink id is its
query's:

1. read the claim, quickly (as the group last applied it, never waiting): the
   committed offset of the group ``<prefix>-<sink id>-claim`` on the marker topic's
   partition 0 (1 = claimed; its metadata the query id); when the group's offsets
   are gone (expired), the claim's record in the marker log, and for a sink that
   wrote before claims existed, the queries its markers in the log name;
2. if another query holds it: :class:`SinkClaimedError`, nothing written;
3. if nobody does: a transaction of the transactional id ``<prefix>-<sink id>-claim``
   commits the claim (the group offset and the log record). Its
   ``init_transactions()`` fences every other claimer and ends its open
   transaction, and the claim is read again after it, stably: of two queries
   claiming at once, the second to initialise either sees the first's committed
   claim, or fences it (the first's commit then fails, and it reads again and
   finds the second's). A compare-and-set, by fencing. Claimers that fenced each
   other try again after a random wait that doubles (the first tasks of one query
   all claim at once, and in lockstep would fence each other every time).

Only a task partition without a marker of its own query looks at the claim (its
first batch, or a partition whose tasks had no rows so far): later batches find
their query in the marker, so this costs nothing per batch.

A stream's driver takes the claim once at the query's start (:func:`claim_at_start`),
before any task runs, when it can read the query id in the checkpoint: the first
batch's tasks then find the claim theirs at their first look, instead of all taking
it at once and fencing each other, and a second query on the sink id is refused at
its start rather than at its first batch.
"""

from __future__ import annotations

import logging
import random
import re
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from eos_connectors.core.errors import EosError, keeping_code
from eos_connectors.core.protocol import Lineage, SinkClaimedError
from eos_connectors.sinks.kafka.clients import (
    CALL_LIMIT,
    LIBRDKAFKA_LOG,
    DeliveryFailures,
    bounded,
    missing,
    topic_gone,
)
from eos_connectors.sinks.kafka.errors import FENCED_CODES, acl_needed, error_of
from eos_connectors.sinks.kafka.marker import marker_consumer
from eos_connectors.sinks.kafka.marker_log import Marker, decode, encode, read_for
from eos_connectors.sinks.kafka.options import KafkaSinkOptions

log = logging.getLogger(__name__)

CALL_TIMEOUT = 60.0
#: Claimers that keep fencing each other (the first tasks of one query, all claiming at
#: once) wait a random while, doubling up to ``BACKOFF_CAP_S``, before fencing again:
#: without it, three tasks fenced each other five times in a second and two failed.
ATTEMPTS = 10
BACKOFF_S = 0.1
BACKOFF_CAP_S = 2.0
CLAIMED = 1  # the claim group's committed offset while a query holds the claim


class ClaimError(EosError):
    """The sink's claim could not be read or written; nothing was written."""


def claim_name(options: KafkaSinkOptions, sink_id: str) -> str:
    """The claim's transactional id, consumer group and marker log key."""
    return f"{options.transactional_id_prefix}-{sink_id}-claim"


def ensure_claimed(options: KafkaSinkOptions, sink_id: str, query_id: str) -> None:
    """Task (and a stream's driver at its start): return once ``query_id`` holds the
    claim on ``sink_id``; raise :class:`SinkClaimedError` when another query does."""
    name = claim_name(options, sink_id)
    # the first look is quick (read_uncommitted: as the group last applied it); only the
    # read after this claimer's init_transactions() is stable (read_committed waits
    # while a transaction holds a pending offset for the group)
    quick = marker_consumer(options, name, "read_uncommitted")
    try:
        if _is_ours(options, sink_id, query_id, quick):
            return
        stable = marker_consumer(options, name, "read_committed")
        try:
            _take(options, sink_id, query_id, stable, quick)
        finally:
            stable.close()
    finally:
        quick.close()


def claim_at_start(options: KafkaSinkOptions, checkpoint: str | None) -> None:
    """Driver, at a stream's start: take the claim on the sink id for the query the
    ``checkpoint``'s metadata names. Nothing happens when the checkpoint cannot be read
    here (set through Spark's conf, or on a store the package does not read) or the
    claim cannot be taken (the driver lacks the claim's transactional id ACL): the
    tasks claim as before. :class:`SinkClaimedError` when another query holds it, and a
    :class:`ClaimError` naming the ACL when the markers' topic or groups refuse it."""
    from eos_connectors.core.checkpoint_sinks import checkpoint_query_id

    query_id = checkpoint_query_id(checkpoint)
    if query_id is None:
        return
    sink_id = options.sink_id_for(query_id)
    try:
        ensure_claimed(options, sink_id, query_id)
    except (ClaimError, KafkaException) as exc:
        if getattr(exc, "code", None) in _NO_TASK_HAS:
            raise  # the tasks' principal lacks it too: fail at the start, naming the ACL
        log.warning("sink %s not claimed at the start (its tasks claim it): %s", sink_id, exc)


#: ACL refusals the driver's claim meets that the tasks would meet as well: on the
#: markers' topic and groups (a claim refused on its transactional id is left to the
#: tasks, whose principal may differ).
_NO_TASK_HAS = frozenset(
    KafkaError(code).name()
    for code in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED)
)


def _is_ours(options: KafkaSinkOptions, sink_id: str, query_id: str, consumer: Consumer) -> bool:
    """Whether ``query_id`` holds the claim as ``consumer`` reads it (quickly, or stably
    after this claimer's fencing); SinkClaimedError when another query does."""
    owner, in_group = read_claim(options, sink_id, consumer)
    _refuse_other(sink_id, owner, query_id)
    return owner == query_id and in_group


def read_claim(options: KafkaSinkOptions, sink_id: str, consumer: Consumer) -> tuple[str, bool]:
    """(the query holding the claim or "", whether the claim group holds it)."""
    position = TopicPartition(options.marker_topic, 0)
    try:
        (claimed,) = consumer.committed([position], timeout=CALL_TIMEOUT)
    except KafkaException as exc:
        raise keeping_code(
            ClaimError(
                f"Reading the claim on sink {sink_id!r} failed: {error_of(exc).str()}. "
                f"{_then(options, sink_id, exc)}"
            ),
            exc,
        ) from None
    if claimed.error is None and claimed.offset >= 0:
        owner = (claimed.metadata or "") if claimed.offset == CLAIMED else ""
        return owner, True
    return _claim_in_log(options, sink_id), False


def _claim_in_log(options: KafkaSinkOptions, sink_id: str) -> str:
    """The claim as the marker log keeps it (the group's offsets expired), else the one
    query the sink's markers name (a sink that wrote before claims existed), else ""."""
    name = claim_name(options, sink_id)
    mine = _own_keys(options, sink_id)
    latest: dict[bytes, bytes | None] = {}
    records = read_for(
        options, lambda key: mine.fullmatch(key) is not None, f"the claim on sink {sink_id!r}"
    )
    for record in records:
        if record.key is not None and mine.fullmatch(record.key):
            latest[record.key] = record.value or None
    if name.encode() in latest:
        value = latest[name.encode()]
        marker = decode(value) if value else None
        return marker.query if marker is not None else ""
    owners = {m.query for v in latest.values() if v and (m := decode(v)) is not None} - {""}
    return " and ".join(sorted(owners))


def _own_keys(options: KafkaSinkOptions, sink_id: str) -> re.Pattern[bytes]:
    """The marker log keys of ``sink_id``: ``<prefix>-<sink id>-<task partition>`` and its
    claim, never another sink's whose id starts with this one's (``a`` and ``a-b``)."""
    own = re.escape(f"{options.transactional_id_prefix}-{sink_id}-".encode())
    return re.compile(own + rb"(?:[0-9]+|claim)")


def _refuse_other(sink_id: str, owner: str, query_id: str) -> None:
    if owner and owner != query_id:
        raise SinkClaimedError(sink_id, Lineage(owner), query_id)


def _take(
    options: KafkaSinkOptions, sink_id: str, query_id: str, consumer: Consumer, quick: Consumer
) -> None:
    """The compare-and-set: fence other claimers, read again, commit the claim. A claimer
    fenced by another waits, then looks quickly: the other, often a task of its own
    query, may have committed the claim meanwhile, and fencing it again would only make
    it try again too."""
    name = claim_name(options, sink_id)
    if _gone(consumer, options.marker_topic):  # else its commit is retried for 60 s first
        option = "progressTopic" if options.progress_topic else "topic"
        raise ClaimError(
            f"Claiming sink {sink_id!r} for query {query_id} failed: the sink's "
            f"{topic_gone(options.marker_topic, option)}. Nothing was written."
        )
    for attempt in range(ATTEMPTS):
        undelivered = DeliveryFailures()
        producer = Producer(
            {
                **options.producer_config(),
                "transactional.id": name,
                "delivery.report.only.error": True,
                "on_delivery": undelivered,
                "logger": LIBRDKAFKA_LOG,
            }
        )
        try:
            producer.init_transactions(CALL_TIMEOUT)
            if _is_ours(options, sink_id, query_id, consumer):
                return
            _commit_claim(producer, options, name, query_id, consumer)
            log.info("sink %s claimed by query %s", sink_id, query_id)
            return
        except KafkaException as exc:
            error = error_of(exc)
            if error.code() not in FENCED_CODES or attempt == ATTEMPTS - 1:
                raise keeping_code(
                    ClaimError(
                        f"Claiming sink {sink_id!r} for query {query_id} failed: "
                        f"{_reason(options, error.str(), undelivered)}. "
                        f"{_then(options, sink_id, exc)}"
                    ),
                    exc,
                ) from None
            log.info("another task claimed sink %s at the same time; reading again", sink_id)
            time.sleep(random.uniform(0, min(BACKOFF_CAP_S, BACKOFF_S * 2**attempt)))
            if _is_ours(options, sink_id, query_id, quick):
                return
    raise AssertionError("unreachable")


def _then(options: KafkaSinkOptions, sink_id: str, exc: KafkaException) -> str:
    """What follows a failed claim: the ACL the principal lacks (asking again cannot help),
    or Spark's retry of the task."""
    names = f"{options.transactional_id_prefix}-{sink_id}-*"
    needed = acl_needed(error_of(exc), options.marker_topic, names)
    if needed:
        return f"Nothing was written.{needed}"
    return "Nothing was written; the task fails so Spark retries it."


def _reason(options: KafkaSinkOptions, said: str, undelivered: DeliveryFailures) -> str:
    """Why the claim failed: librdkafka's commit says only that a record failed, so the
    claim's record is named, with its own error, when that is why."""
    if undelivered.first is None:
        return said
    return (
        f"its record to the marker log {options.marker_log!r} (option markerLogTopic) was "
        f"not delivered: {undelivered.first}; the query's start check creates that topic, "
        "so check that it still exists and that its partition 0 has a leader"
    )


def _gone(consumer: Consumer, topic: str) -> bool:
    """Whether the cluster says ``topic`` does not exist: a claim commits the claim's
    offset on its partition 0, which librdkafka asks again for 60 s, then fails with
    "Unknown topic or partition". Deleted after the query started, the topic took the
    markers (offsets on that partition) with it, so every task claims the sink again."""
    try:
        return missing(consumer.list_topics(topic, timeout=5), topic)
    except KafkaException:
        return False  # not known either way: the claim's own error says what failed


def _commit_claim(
    producer: Producer, options: KafkaSinkOptions, name: str, query_id: str, consumer: Consumer
) -> None:
    producer.begin_transaction()
    offsets = [TopicPartition(options.marker_topic, 0, CLAIMED, metadata=query_id)]
    metadata = consumer.consumer_group_metadata()
    bounded(  # may block for good on a lost group coordinator (see clients.OVERRUN_SECONDS)
        lambda: producer.send_offsets_to_transaction(offsets, metadata, CALL_TIMEOUT),
        "send_offsets_to_transaction",
        CALL_LIMIT,
    )
    claim = encode(Marker(0, query_id, options.marker_topic))
    producer.produce(options.marker_log, claim, name.encode(), partition=0)
    producer.commit_transaction(CALL_TIMEOUT)


def check_owner(
    options: KafkaSinkOptions, marker: tuple[int, str] | None, sid: str, query_id: str
) -> None:
    """Task: SinkClaimedError when another query marked the task partition, or holds the
    sink's claim: looked up (and taken, if free) when the marker names no query yet, the
    task partition's first batch or its first since a reset."""
    owner = marker[1] if marker is not None else ""
    if owner and owner != query_id:
        raise SinkClaimedError(sid, Lineage(owner), query_id)
    if not owner:
        ensure_claimed(options, sid, query_id)
