"""Task side: the sink's librdkafka clients: a transactional producer fenced in, the
calls made on it (retried only where librdkafka says so), and its log.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import KafkaError, KafkaException, Producer

from eos_connectors.core.kafka_config import Transient
from eos_connectors.sinks.kafka.errors import (
    FENCED_CODES,
    Action,
    KafkaSinkError,
    classify,
    error_of,
)
from eos_connectors.sinks.kafka.options import KafkaSinkOptions

if TYPE_CHECKING:
    from eos_connectors.sinks.kafka.records import Row

log = logging.getLogger(__name__)

T = TypeVar("T")
CALL_TIMEOUT = 60.0
RETRY_SECONDS = 30.0
#: How long past ``CALL_TIMEOUT`` a librdkafka call may block before the task gives up
#: on it. send_offsets_to_transaction() can block for good when the consumer group's
#: coordinator broker died: librdkafka never checks the coordinator request's timeout
#: (confluentinc/librdkafka#5456), and a coordinator it dropped from its metadata is
#: never asked again (#5511). Seen on a 3-broker cluster: a pooled producer's call hung
#: 3 minutes after the harness killed the coordinator, and the query with it.
OVERRUN_SECONDS = 10.0
#: How long a task waits for send_offsets_to_transaction(), which adds the marker before
#: any record: it takes milliseconds, the length of a coordinator's move when its broker
#: dies (9-23 s here), or for ever when librdkafka lost the group coordinator (even a
#: single broker cut off for 4 s does it). Past this the task fences in a new producer
#: and goes on; nothing of the stuck one's transaction was written yet.
SEND_OFFSETS_LIMIT = 20.0
#: How long a task waits for any other transactional call.
CALL_LIMIT = CALL_TIMEOUT + OVERRUN_SECONDS


class DeliveryFailures:
    """A producer's ``on_delivery`` (with ``delivery.report.only.error``): the first
    record the brokers did not take, as librdkafka says why."""

    def __init__(self) -> None:
        self.first: str | None = None

    def __call__(self, error: KafkaError | None, message: object) -> None:
        if error is not None and self.first is None:
            self.first = error.str()


class StuckCallError(KafkaSinkError):
    """A librdkafka call did not return within its time limit; its producer is left to
    the thread that still waits in it, and is never used or closed again."""


class BrokerLoss:
    """A producer's error callback: whether librdkafka reported a lost broker connection.
    Such a producer is not kept for the next batch: one whose coordinator's broker died
    can block in send_offsets_to_transaction() for good (:data:`SEND_OFFSETS_LIMIT`), and a
    new producer (5-7 ms) starts from fresh metadata."""

    def __init__(self) -> None:
        self.seen = False

    def __call__(self, error: KafkaError) -> None:
        if error.code() in (KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
            self.seen = True


class TransactionalProducer(Producer):
    """A sink task's transactional producer, with what its error callback saw."""

    loss: BrokerLoss


def fenced_producer(options: KafkaSinkOptions, name: str) -> TransactionalProducer:
    """A new producer; its init_transactions() fences every older one of ``name``."""
    loss = BrokerLoss()
    producer = TransactionalProducer(
        {
            **options.producer_config(),
            "transactional.id": name,
            # a failed record fails commit_transaction(): no report per delivered record
            "delivery.report.only.error": True,
            "logger": LIBRDKAFKA_LOG,
            "error_cb": loss,
        }
    )
    producer.loss = loss
    # No metadata request first: with eager connections (CONNECT_AT_ONCE)
    # init_transactions() takes 5-7 ms alone (it waited ~500 ms one time in three
    # without them, and a metadata request first still left it at ~60 ms).
    call(lambda: producer.init_transactions(CALL_TIMEOUT), "init_transactions")
    look_up_topic(producer, options.topic)
    return producer


def look_up_topic(producer: Producer, topic: str | None) -> None:
    """Task, after ``init_transactions()`` (a metadata request before it slows it): the
    topic's partitions now, while the task still waits for Spark's rows. A new producer
    otherwise holds its first rows until it has looked the topic up, a broker round trip
    after the rows came (make bench: the produce step of tasks on a new producer 5.8-6.3
    ms before, 5.0 ms after, against ~2.5 ms on a pooled one). The answer fills the
    producer's metadata cache, so the first rows go out at once; librdkafka (2.16) still
    asks for the topic once more when the first produce() makes its topic handle, in the
    background (counted from its protocol log). Nothing for a ``topic`` column."""
    if topic:
        call(lambda: producer.list_topics(topic, timeout=CALL_TIMEOUT), "metadata")


#: librdkafka's facilities for the errors of the transactional API's calls: a fatal
#: error, and the requests a transaction makes (init, add partitions and offsets, end).
#: A pooled producer is fenced whenever Spark runs its task partition on another worker
#: (that is how the pool works: the task logs one INFO line and takes a new producer),
#: and every such error also fails the call that met it, which raises it: the task's
#: own error or log line carries it. Decided by facility, never by the text.
FATAL_FACILITIES = frozenset(
    {"TXNERR", "FATAL", "INITPID", "ADDPARTS", "ADDOFFSETS", "ENDTXN", "TXNAPI"}
)


class _RaisedAnyway(logging.Filter):
    """Drops librdkafka's lines of :data:`FATAL_FACILITIES` (confluent-kafka logs
    ``"%s [%s] %s" % (facility, client name, text)``); every other line passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (args and args[0] in FATAL_FACILITIES)


#: librdkafka's log of the sink's transactional producers.
LIBRDKAFKA_LOG = logging.getLogger("eos_connectors.sinks.kafka.librdkafka")
LIBRDKAFKA_LOG.addFilter(_RaisedAnyway())
LIBRDKAFKA_LOG.addFilter(Transient())


def is_fenced(exc: KafkaSinkError) -> bool:
    cause = exc.__cause__
    return isinstance(cause, KafkaException) and is_fatal(error_of(cause))


def is_fatal(error: KafkaError) -> bool:
    return error.code() in FENCED_CODES or error.fatal()


def produce_rows(producer: Producer, batches: Iterator[list[Row]]) -> int:
    """Produce every row; poll(0) keeps delivery reports flowing, a full queue waits."""
    count = 0
    produce = producer.produce
    for batch in batches:
        for topic, value, key, partition, headers, timestamp in batch:
            kwargs: dict[str, Any] = {}
            if partition is not None:
                kwargs["partition"] = partition
            if headers:
                kwargs["headers"] = headers
            if timestamp is not None:
                kwargs["timestamp"] = timestamp
            while True:
                try:
                    produce(topic, value, key, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)
                except KafkaException as exc:
                    raise _produce_failed(producer, topic, exc) from exc
        count += len(batch)
        producer.poll(0)
    return count


def _produce_failed(producer: Producer, topic: str, exc: KafkaException) -> KafkaSinkError:
    """produce() refused a record. In a fatal state it says only "Fatal error"; the
    transaction calls return the fatal error itself (e.g. fenced by a newer instance)."""
    error = error_of(exc)
    reason = error.str()
    if is_fatal(error) or error.code() == KafkaError._FATAL:
        try:
            producer.abort_transaction(10)  # returns at once, with the fatal error
        except KafkaException as fatal:  # a plain producer's says only "not transactional"
            if is_fatal(error_of(fatal)):
                reason = error_of(fatal).str()
    return KafkaSinkError(f"Producing a record to topic {topic!r} failed: {reason}")


def call(call: Callable[[], T], what: str, limit: float = CALL_LIMIT) -> T:
    """Run a transactional call, retrying only what :func:`classify` says to retry, for
    up to ``RETRY_SECONDS`` (a coordinator that moves when its broker dies takes the
    broker's session timeout, ~9 s by default, to come back); each try given up after
    ``limit`` seconds (:func:`bounded`)."""
    deadline = time.monotonic() + RETRY_SECONDS
    attempt = 0
    while True:
        try:
            return bounded(call, what, limit)
        except KafkaException as exc:
            error = error_of(exc)
            action = classify(error)
            if action is not Action.RETRY or time.monotonic() > deadline:
                raise KafkaSinkError(f"{what} failed ({action.value}): {error.str()}") from exc
            log.warning("%s: %s; retrying", what, error.str())
            time.sleep(min(2.0, 0.2 * 2**attempt))
            attempt += 1


def bounded(call: Callable[[], T], what: str, limit: float) -> T:
    """``call()`` on a helper thread, its result or its error; :class:`StuckCallError`
    when it has not returned after ``limit`` seconds (librdkafka's calls cannot be
    interrupted: the thread is left waiting in it, and the producer is never called
    again; a new producer's init_transactions() fences it). A thread costs ~0.1 ms
    against the milliseconds of a broker round trip; three calls per task."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append((True, call()))
        except BaseException as exc:  # handed to the caller's thread
            outcome.append((False, exc))

    helper = threading.Thread(target=run, name=f"eos-kafka {what}", daemon=True)
    helper.start()
    helper.join(limit)
    if not outcome:
        raise StuckCallError(
            f"{what} did not return within {limit:.0f} s (librdkafka waits for a coordinator "
            "it lost for good: confluentinc/librdkafka#5456). Its producer is dropped; a new "
            "one fences it."
        )
    done, value = outcome[0]
    if not done:
        raise value
    return value  # type: ignore[no-any-return]


def abort_quietly(producer: Producer) -> None:
    try:
        producer.abort_transaction(CALL_TIMEOUT)
    except KafkaException as exc:
        log.warning("abort_transaction after a failure: %s", error_of(exc).str())


#: Producers tasks are done with, for :func:`_reap` to destroy.
_RETIRED: queue.SimpleQueue[Producer] = queue.SimpleQueue()
_REAPER_LOCK = threading.Lock()
_reaper: threading.Thread | None = None
#: How long the reaper waits for the task to drop its own reference to a retired
#: producer; past it the last holder destroys it wherever that is.
RETIRE_WAIT_S = 1.0


def retire(producer: Producer) -> None:
    """Task: destroy ``producer`` on a background thread, not on the task's path.

    ``rd_kafka_destroy`` joins librdkafka's threads and closes its connections: 6-9 ms
    a producer (measured on the local stack), which the batch commit's tasks, each with a
    new producer, paid before returning. confluent-kafka runs it without the GIL in the
    producer's deallocation, so it is the reaper thread's last reference, dropped after
    the caller has dropped its own, that destroys it while the worker goes on. Never
    ``close()``: that aborts an open transaction, which the batch commit leaves for the
    driver; destroying does not. A worker that exits first leaves the producer to the
    exit, as a killed task does."""
    global _reaper
    _RETIRED.put(producer)
    with _REAPER_LOCK:
        if _reaper is None or not _reaper.is_alive():  # none yet, or forked from a parent
            _reaper = threading.Thread(target=_reap, name="eos-kafka reaper", daemon=True)
            _reaper.start()


@contextmanager
def retiring(producer: Producer) -> Iterator[Producer]:
    """Task: ``producer`` handed to :func:`retire` when the block ends, however it ends;
    the reaper destroys it once the caller's frame lets it go too."""
    try:
        yield producer
    finally:
        retire(producer)


def _reap() -> None:
    """Task side, the reaper thread: each retired producer destroyed once the task let it go
    (this thread's reference and ``getrefcount``'s own are the two left)."""
    while True:
        producer = _RETIRED.get()
        deadline = time.monotonic() + RETIRE_WAIT_S
        while sys.getrefcount(producer) > 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        del producer
