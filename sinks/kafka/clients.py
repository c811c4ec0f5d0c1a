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


#: How many bytes of a record's key an error shows.
KEY_SHOWN = 40
#: How long each wait for a transaction's acknowledgements lasts before the task looks
#: for a refused record again (a refused record's later ones are never acknowledged).
FLUSH_SLICE = 0.5


def record_named(topic: str, key: bytes | str | None, size: int) -> str:
    """A record as an error names it: its topic, its key's first bytes and its value's
    size (the value is never shown: it may hold what the log must not)."""
    if isinstance(key, bytes):  # as a delivery report gives it; shown as the text it is
        key = key.decode("utf-8", "backslashreplace")
    cut = key is not None and len(key) > KEY_SHOWN
    shown = f"{key[:KEY_SHOWN]!r}..." if cut and key is not None else repr(key)
    return f"the record with key {shown} ({size:,} bytes of value) to topic {topic!r}"


def too_large_for_producer(error: KafkaError) -> str:
    """What to do about a record produce() refused, when it was for its size."""
    if error.code() != KafkaError.MSG_SIZE_TOO_LARGE:
        return ""
    return (
        "; it is larger than the producer allows, kafka.message.max.bytes (librdkafka's "
        "default 1000000; Java's max.request.size): raise it, and the topic's "
        "max.message.bytes with it, or write smaller records"
    )


#: A record's topic does not exist (the broker's answer, or librdkafka's after its
#: metadata said so).
_NO_TOPIC = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})


class DeliveryFailures:
    """A producer's ``on_delivery`` (with ``delivery.report.only.error``): how many
    records the brokers refused, and why (:attr:`first`), naming the record: the first
    refused or, when a broker refused them for their size, the largest, and when it
    failed to validate them, one without a key (a broker refuses a whole batch of records,
    and reports each of them)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.count = 0
        self._error: KafkaError | None = None
        self._record: tuple[str, Any, int] = ("", None, 0)  # topic, key, value's bytes

    def __call__(self, error: KafkaError | None, message: Any) -> None:
        if error is None:
            return
        self.count += 1
        size = len(message.value() or b"")
        if self._error is None:
            self._error = error
        elif not self._tells_more(message.key(), size):
            return  # named already: the first, or one that tells the cause better
        self._record = (message.topic(), message.key(), size)

    def _tells_more(self, key: Any, size: int) -> bool:
        """Whether a record tells why its batch was refused better than the one named:
        a larger one refused for its size, a keyless one refused by validation."""
        code = self._error.code() if self._error is not None else None
        if code == KafkaError.MSG_SIZE_TOO_LARGE:
            return size > self._record[2]
        return code == KafkaError.INVALID_RECORD and key is None and self._record[1] is not None

    @property
    def error(self) -> KafkaError | None:
        """The first refused record's error (a fenced producer's records come back with
        its fatal error: the callers tell a fenced producer by it)."""
        return self._error

    @property
    def first(self) -> str | None:
        """Why the brokers refused the records, or None when they refused none."""
        if self._error is None:
            return None
        topic, key, size = self._record
        said = f"Kafka refused {self.count} records ({self._error.str()})"
        if self._error.code() in _NO_TOPIC:
            return (
                f"{said}; the first was {record_named(topic, key, size)}, which does not "
                "exist: the sink writes only to existing topics and never creates one "
                "(create it, or mend the rows' topic column)"
            )
        if self._error.code() == KafkaError.INVALID_RECORD and key is None:
            return (
                f"{said}; one was {record_named(topic, key, size)}. A compacted topic "
                "(cleanup.policy compact) refuses a record without a key, and with it the "
                "batch of records it came in: give every row a key, or filter out the rows "
                "whose key is null"
            )
        if self._error.code() != KafkaError.MSG_SIZE_TOO_LARGE:
            return f"{said}; the first was {record_named(topic, key, size)}"
        return (
            f"{said}; the largest was {record_named(topic, key, size)}. The topic takes at most "
            "its max.message.bytes (by default the broker's message.max.bytes, 1048588) in a "
            "record or in a batch of records, and librdkafka batches up to kafka.batch.size "
            "(1000000 by default): raise the topic's max.message.bytes, or set "
            "kafka.batch.size below it and write smaller records"
        )


@contextmanager
def fatal_as_sink_error(producer: Producer, where: str) -> Iterator[None]:
    """Task: a fatal error (a fenced producer) that poll() or flush() raises, as
    KafkaSinkError with the KafkaException as its cause, as callers tell a fenced producer.
    confluent-kafka raises it as itself; but when it serves delivery reports in the poll
    that met it (a producer with an ``error_cb``), it raises a SystemError: the report's
    callback met the error left set ("returned a result with an exception set", the
    error its cause), or the error was lost on the way ("returned NULL without setting an
    exception"; seen in one services run of three). The producer itself then says it:
    a fatal producer's abort_transaction() fails at once with its fatal error."""
    try:
        yield
    except (KafkaException, SystemError) as exc:
        fatal = _kafka_exception_in(exc)
        if fatal is None and isinstance(exc, SystemError):
            fatal = _fatal_state(producer)
        if fatal is None:
            raise
        raise KafkaSinkError(f"{where}: {error_of(fatal).str()}") from fatal


def _kafka_exception_in(exc: BaseException | None) -> KafkaException | None:
    while exc is not None and not isinstance(exc, KafkaException):
        exc = exc.__cause__ or exc.__context__
    return exc


def _fatal_state(producer: Producer) -> KafkaException | None:
    """The producer's fatal error, or None (the task fails anyway: an abort of a
    transaction that was not fatal only comes sooner)."""
    try:
        producer.abort_transaction(10)
    except KafkaException as exc:
        return exc if is_fatal(error_of(exc)) else None
    return None


def wait_delivered(producer: Producer, failures: DeliveryFailures, where: str) -> None:
    """Task: every record the open transaction holds acknowledged, or KafkaSinkError
    naming the first one a broker refused or how many were not acknowledged within
    ``CALL_TIMEOUT`` (the caller aborts the transaction). A refused record makes the
    transaction abortable and its later records are never acknowledged, so the wait ends
    at the refusal (a 2 MB record to a topic that takes 1 MB waited out the whole flush,
    60 s, and was not named)."""
    deadline = time.monotonic() + CALL_TIMEOUT
    with fatal_as_sink_error(producer, where):
        left = producer.flush(FLUSH_SLICE)
        while left and failures.first is None and time.monotonic() < deadline:
            left = producer.flush(FLUSH_SLICE)
    if failures.first is None and not left:
        return
    why = failures.first or f"{left} records were not acknowledged within {CALL_TIMEOUT:.0f} s"
    cause = KafkaException(failures.error) if failures.error is not None else None
    raise KafkaSinkError(
        f"{where}: {why}. Its transaction is aborted, and the task fails so Spark retries it "
        "(nothing of it is visible)."
    ) from cause


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
    """A sink task's transactional producer, with what its error and delivery callbacks
    saw (its records' failures cleared when it begins a transaction)."""

    loss: BrokerLoss
    failures: DeliveryFailures


def fenced_producer(options: KafkaSinkOptions, name: str) -> TransactionalProducer:
    """A new producer; its init_transactions() fences every older one of ``name``."""
    loss, failures = BrokerLoss(), DeliveryFailures()
    producer = TransactionalProducer(
        {
            **options.producer_config(),
            "transactional.id": name,
            # reports of failed records only: none per delivered record
            "delivery.report.only.error": True,
            "on_delivery": failures,
            "logger": LIBRDKAFKA_LOG,
            "error_cb": loss,
        }
    )
    producer.loss, producer.failures = loss, failures
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
    background (counted from its protocol log). Nothing for a ``topic`` column.

    A topic the answer does not list was deleted after the start check found it: asked
    again for ``GONE_AFTER_S``, then KafkaSinkError says so (its rows otherwise waited
    ~60 s for the broker's refusal, which said only "Unknown topic or partition")."""
    if not topic:
        return
    deadline = time.monotonic() + GONE_AFTER_S
    while missing(_metadata(producer, topic), topic):
        if time.monotonic() > deadline:
            raise KafkaSinkError(f"The sink's {topic_gone(topic, 'topic')}.")
        time.sleep(0.5)


def _metadata(producer: Producer, topic: str) -> Any:
    return call(lambda: producer.list_topics(topic, timeout=CALL_TIMEOUT), "metadata")


#: How long a task asks again for a topic its broker does not list, before it says the
#: topic is gone (a broker may serve a topic made a moment ago a little later).
GONE_AFTER_S = 5.0


def missing(metadata: Any, topic: str) -> bool:
    """Whether ``metadata`` (a list_topics() answer) says ``topic`` does not exist."""
    found = metadata.topics.get(topic)
    unknown = KafkaError.UNKNOWN_TOPIC_OR_PART
    return found is None or (found.error is not None and found.error.code() == unknown)


def topic_gone(topic: str, option: str) -> str:
    """What a task says of its topic deleted after the query started (the start check
    found it)."""
    return (
        f"topic {topic!r} (option {option}) no longer exists: it was deleted after the query "
        "started, and the sink writes only to an existing topic. Create it again and restart "
        "the query (what was written to it before is gone with it)"
    )


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
    with fatal_as_sink_error(producer, "Producing records"):
        return _produce_rows(producer, batches)


def _produce_rows(producer: Producer, batches: Iterator[list[Row]]) -> int:
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
                    raise _produce_failed(producer, topic, exc, key, value) from exc
        count += len(batch)
        producer.poll(0)
    return count


def _produce_failed(
    producer: Producer, topic: str, exc: KafkaException, key: Any, value: Any
) -> KafkaSinkError:
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
    named = record_named(topic, key, len(value or b""))
    return KafkaSinkError(f"Producing {named} failed: {reason}{too_large_for_producer(error)}")


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
