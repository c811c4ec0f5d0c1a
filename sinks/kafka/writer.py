"""The Kafka sink's task side: one transaction per task, fenced and marked with its batch.

librdkafka cannot prepare a transaction in one process and commit it in another,
so each task commits its own transaction: the records and, inside the same
transaction, a progress marker (the committed offset ``batch + 1`` of a
sink-owned consumer group). A batch already marked is not written again.

Producers and marker consumers are pooled per Python worker (Spark reuses its
workers across tasks and batches; :class:`ClientPool`), so a task does not pay
for a new producer, its metadata and ``init_transactions()`` every batch.
Fencing still decides who may commit: ``init_transactions()`` of a producer of
the same (sink, task partition) anywhere fences every earlier one and ends its
open transaction. A pooled producer may have been fenced meanwhile by another
worker, so a task's first broker call in its transaction is the marker's offset
(``send_offsets_to_transaction``), before any record: a fenced pooled producer
fails there, and the task takes a new producer (whose ``init_transactions()``
fences the others in turn), reads the marker again and goes on. A fencing found
later, once records went out, fails the task as before.

The same transaction also writes the marker as a record, keyed by the
transactional id, to a compacted *marker log* topic: group offsets expire
(``offsets.retention.minutes``) once a sink stops, the log never does, so a
marker missing from the group is looked up there before a batch counts as new.
Both carry the query id that wrote them: a marker of another query (a new
checkpoint, or a second query, with the same ``sinkId``) fails the task instead
of skipping its batches.

A pooled producer remembers the marker its own last transaction committed, and a
task that takes it reads no marker from the broker: only a transaction of this
transactional id moves the marker, any other producer of the id must have called
``init_transactions()`` first, and that fences this one, which the task finds out at
the marker's offset before it trusts what it remembers.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from connectors import faults, timing
from connectors.ahead import RowsAhead
from connectors.context import TaskIdentity, current_batch
from connectors.errors import EosError
from connectors.protocol import Lineage, SinkClaimedError, derive_sink_id
from connectors.secrets import settings_digest
from connectors.topics import read_to_end
from sinks.kafka.errors import FENCED_CODES, Action, classify, error_of
from sinks.kafka.marker_log import Marker, decode, encode
from sinks.kafka.options import CONNECT_AT_ONCE, KafkaSinkOptions, transactional_id
from sinks.kafka.records import Row, rows

log = logging.getLogger(__name__)

T = TypeVar("T")
CALL_TIMEOUT = 60.0
RETRIES = 5


class KafkaSinkError(EosError):
    """The Kafka sink could not complete a task's transaction."""


class _StaleProducerError(KafkaSinkError):
    """A pooled producer was fenced (or broken) before its transaction wrote anything."""


class TaskReport(WriterCommitMessage):
    """What one task did: records written, or skipped because its batch was marked."""

    def __init__(self, batch_id: int, partition: int, records: int, skipped: bool) -> None:
        self.batch_id = batch_id
        self.partition = partition
        self.records = records
        self.skipped = skipped


def sink_id(options: KafkaSinkOptions, query_id: str) -> str:
    target = options.topic or options.progress_topic or ""
    return options.sink_id or derive_sink_id("k", query_id, target)


class KafkaTransactionalWriter(DataSourceStreamArrowWriter):
    """Exactly-once under deterministic replay.

    Guarantee: a task's records become visible to read_committed readers when
    its transaction commits, before Spark completes the batch; every record is
    written exactly once, provided a replayed batch gives each task partition the
    same records (true for eos_kafka input and deterministic stages).
    """

    def __init__(self, options: KafkaSinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        """Task: Spark's entry point; see :meth:`write_task`."""
        return self.write_task(TaskIdentity.current(), iterator)

    def write_task(
        self, task: TaskIdentity, iterator: Iterator[pa.RecordBatch], pool: ClientPool | None = None
    ) -> TaskReport:
        """Task: 1. a producer and marker consumer from the worker's pool; 2. read the
        marker; 3. the marker's offset first in the transaction (a fenced pooled producer
        is replaced here, before any record); 4. produce; 5. commit; 6. back to the pool.
        Spark's first rows are pulled on a thread during 1-3 (:class:`RowsAhead`)."""
        steps = timing.TaskSteps("sink write", task.batch_id, rest="produce")
        pool = pool or CLIENTS
        sid = sink_id(self.options, task.query_id)
        name = transactional_id(self.options, sid, task.partition)
        with RowsAhead(iterator) as ahead:
            rows_in = steps.pulled("waiting for rows", iter(ahead))
            producer, marker, fresh = pool.take(self.options, name)
            steps.add("client set-up", steps.began)
            try:
                report, producer = self._attempts(producer, marker, fresh, task, rows_in, sid,
                                                  steps, pool)  # fmt: skip
            except BaseException:
                pool.discard(marker)
                raise
            finally:
                steps.record()
        pool.give_back(self.options, name, producer, marker)
        faults.point("after-commit", task.batch_id, role="worker", query=task.query_name)
        return report

    def _attempts(self, producer: Producer, marker: _MarkerGroup, fresh: bool,
                  task: TaskIdentity, rows_in: Iterator[pa.RecordBatch], sid: str,
                  steps: timing.TaskSteps,
                  pool: ClientPool) -> tuple[TaskReport, Producer]:  # fmt: skip
        """Task: the transaction, again with a new producer when the pooled one was stale."""
        while True:
            try:
                return self._attempt(producer, marker, task, rows_in, sid, steps), producer
            except _StaleProducerError as exc:
                if fresh:
                    raise
                log.info("pooled producer %s is stale (%s): initialising a new one",
                         marker.group, exc)  # fmt: skip
                since = time.perf_counter()
                marker.known = None  # another producer of the id may have moved it
                # the marker group is named after the transactional id
                producer, fresh = pool.new_producer(self.options, marker.group), True
                steps.add("client set-up", since)

    def _attempt(self, producer: Producer, marker: _MarkerGroup, task: TaskIdentity,
                 iterator: Iterator[pa.RecordBatch], sid: str,
                 steps: timing.TaskSteps) -> TaskReport:  # fmt: skip
        """Begin with the marker's offset (a stale producer fails here), then the marker
        (remembered by a pooled producer, else read): a marked batch aborts the empty
        transaction and is skipped."""
        since = time.perf_counter()
        _begin(producer, marker, task)
        try:
            done, owner = marker.known = marker.known or marker.read()
            steps.add("begin and marker", since)
            if owner and owner != task.query_id:
                raise SinkClaimedError(sid, Lineage(owner), task.query_id)
            if done > task.batch_id:
                log.info("batch %d partition %d is marked: skipping", task.batch_id,
                         task.partition)  # fmt: skip
                _call(lambda: producer.abort_transaction(CALL_TIMEOUT), "abort_transaction")
                return TaskReport(task.batch_id, task.partition, 0, skipped=True)
            _log_marker(producer, marker, task)
            faults.point("before-prepare", task.batch_id, role="worker", query=task.query_name)
            batches = rows(iterator, self.options.topic)
            count = _finish(producer, task, batches, sid, steps)
            marker.known = (task.batch_id + 1, task.query_id)
        except Exception:  # a crash (or a simulated one) leaves it open, for fencing to end
            _abort_quietly(producer)
            raise
        return TaskReport(task.batch_id, task.partition, count, skipped=False)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: each task committed its own transaction."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to do: an unfinished task transaction is aborted by the next attempt's
        init_transactions(), or by the broker after transaction.timeout.ms."""


class _MarkerGroup:
    """The sink-owned consumer group whose committed offset on the marker topic's
    partition 0 is "the next batch to write" for one task partition, with the query
    id that wrote it as the offset's metadata."""

    def __init__(self, options: KafkaSinkOptions, group: str) -> None:
        self.topic = options.marker_topic
        self.group = group
        self.options = options
        #: The marker as the pooled producer's own last transaction left it (set only
        #: while that producer is unfenced; see the module's docstring), else None.
        self.known: tuple[int, str] | None = None
        self.consumer = Consumer(
            {
                **CONNECT_AT_ONCE,
                **options.client_config(),
                "group.id": group,
                # committed() then asks for the committed offset without require_stable:
                # the task reads the marker inside its own transaction, after adding the
                # next marker to it, and a stable read would wait for that transaction.
                # Only committed offsets are returned either way, and no other
                # transaction of this id can be pending: its producer was fenced.
                "isolation.level": "read_uncommitted",
                "enable.auto.commit": False,
                "log_level": 4,
            }
        )

    def read(self) -> tuple[int, str]:
        """(batches done, the query id that marked them): (0, "") before any marker. A broker
        error is raised with its code, never read as "nothing done"."""
        position = TopicPartition(self.topic, 0)
        marked = _call(lambda: self.consumer.committed([position], timeout=CALL_TIMEOUT),
                       f"reading marker {self.group}")[0]  # fmt: skip
        if marked.error is not None:
            raise KafkaSinkError(
                f"Reading the progress marker of {self.group} on {self.topic} failed "
                f"({marked.error.name()}): {marked.error.str()}. Nothing was written; the "
                "task fails so Spark retries it."
            )
        if marked.offset < 0:  # never marked, or the group's offsets expired
            return self.read_log()
        return int(marked.offset), marked.metadata or ""

    def read_log(self) -> tuple[int, str]:
        """The task partition's last marker in the marker log (read_committed, to the last
        stable offset): (0, "") when it never wrote one."""
        options = self.options
        try:
            records = read_to_end(
                options.bootstrap_servers,
                options.marker_log,
                settings=options.client_config(),
                timeout=CALL_TIMEOUT,
            )
        except EosError as exc:
            raise KafkaSinkError(
                f"Reading the marker log {options.marker_log!r} failed: {exc}. Nothing was "
                "written; the task fails so Spark retries it."
            ) from None
        key = self.group.encode()
        mine = [r for r in records if r.key == key]
        if not mine or not mine[-1].value:  # none, or a tombstone of `eos sinks reset`
            return 0, ""
        marker = decode(mine[-1].value)
        if marker is None:
            raise KafkaSinkError(
                f"The marker log {options.marker_log!r} holds a record keyed {self.group!r} "
                f"at offset {mine[-1].offset} that is not a sink marker, so whether this "
                "batch was written is unknown. Nothing was written. Remove the record (`eos "
                "sinks reset` writes a tombstone) only if this task partition never wrote "
                "a batch of this query."
            )
        return marker.next_batch, marker.query

    def log_record(self, next_batch: int, query_id: str) -> tuple[str, bytes, bytes]:
        """(topic, key, value) of the marker record the transaction writes to the log."""
        value = encode(Marker(next_batch, query_id, self.topic))
        return self.options.marker_log, self.group.encode(), value

    def offset(self, next_batch: int, query_id: str) -> TopicPartition:
        return TopicPartition(self.topic, 0, next_batch, metadata=query_id)

    def group_metadata(self) -> Any:
        return self.consumer.consumer_group_metadata()

    def close(self) -> None:
        self.consumer.close()


def _fenced_producer(options: KafkaSinkOptions, name: str) -> Producer:
    """A new producer; its init_transactions() fences every older one of ``name``."""
    producer = Producer(
        {
            **options.producer_config(),
            "transactional.id": name,
            # a failed record fails commit_transaction(): no report per delivered record
            "delivery.report.only.error": True,
            "logger": LIBRDKAFKA_LOG,
        }
    )
    # No metadata request first: with eager connections (CONNECT_AT_ONCE)
    # init_transactions() takes 5-7 ms alone (it waited ~500 ms one time in three
    # without them, and a metadata request first still left it at ~60 ms).
    _call(lambda: producer.init_transactions(CALL_TIMEOUT), "init_transactions")
    if options.topic:
        # The topic's partitions now, while the task still waits for Spark's rows: a new
        # producer otherwise holds its first rows until it has looked the topic up, a
        # broker round trip after the rows came (make bench: the produce step of tasks on
        # a new producer 5.8-6.3 ms before, 5.0 ms after, against ~2.5 ms on a pooled
        # one). The answer fills the producer's metadata cache; producing asks for none.
        _call(lambda: producer.list_topics(options.topic, timeout=CALL_TIMEOUT), "metadata")
    return producer


class _ExpectedFencing(logging.Filter):
    """Drops librdkafka's error lines about a pooled producer fenced by a newer
    instance: another worker took the transactional id for the same task partition,
    which is how the pool works (the task logs one INFO line and takes a new
    producer). Every other librdkafka line passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "fenced by a newer instance" not in record.getMessage()


#: librdkafka's log of the sink's transactional producers.
LIBRDKAFKA_LOG = logging.getLogger("sinks.kafka.librdkafka")
LIBRDKAFKA_LOG.addFilter(_ExpectedFencing())


class ClientPool:
    """Task side: one Python worker's idle transactional producers and marker consumers,
    by transactional id and client settings, kept across tasks and batches.

    A task takes its pair out (so two tasks never share one), and gives it back only
    after a committed or skipped transaction; after any error both are dropped. At most
    ``size`` pairs stay idle, the least recently used closed first.
    """

    def __init__(self, size: int = 32) -> None:
        self.size = size
        self._idle: OrderedDict[tuple[str, str], tuple[Producer, _MarkerGroup]] = OrderedDict()
        self.created = 0  # producers made (and fenced in): for tests and the profile

    def take(self, options: KafkaSinkOptions, name: str) -> tuple[Producer, _MarkerGroup, bool]:
        """``name``'s idle producer and marker consumer, taken out of the pool (the bool
        False), or new ones, the producer fenced in (True)."""
        idle = self._idle.pop(_pool_key(options, name), None)
        if idle is not None:
            return idle[0], idle[1], False
        return self.new_producer(options, name), _MarkerGroup(options, name), True

    def new_producer(self, options: KafkaSinkOptions, name: str) -> Producer:
        """A new producer of ``name``, fenced in (it fences every other one)."""
        self.created += 1
        return _fenced_producer(options, name)

    def give_back(self, options: KafkaSinkOptions, name: str, producer: Producer,
                  marker: _MarkerGroup) -> None:  # fmt: skip
        self._idle[_pool_key(options, name)] = (producer, marker)  # taken out: goes last
        while len(self._idle) > self.size:
            _, (_, oldest) = self._idle.popitem(last=False)
            oldest.close()

    def discard(self, marker: _MarkerGroup) -> None:
        """Drop a task's pair after an error (the producer may be fenced or mid-transaction:
        it is never given back, and goes with its last reference)."""
        marker.close()


def _pool_key(options: KafkaSinkOptions, name: str) -> tuple[str, str]:
    """The transactional id and a digest of the settings (which may hold credentials)."""
    return name, settings_digest(options.producer_config())


#: This Python worker's pool (module state lives as long as Spark reuses the worker).
CLIENTS = ClientPool()


def _begin(producer: Producer, marker: _MarkerGroup, task: TaskIdentity) -> None:
    """Begin, and add the marker's offset ``batch + 1``: the transaction's first broker
    call, so a fenced (pooled) producer fails here, as :class:`_StaleProducerError`,
    before any record went out."""
    try:
        _call(producer.begin_transaction, "begin_transaction")
        offsets = [marker.offset(task.batch_id + 1, task.query_id)]
        metadata = marker.group_metadata()
        _call(
            lambda: producer.send_offsets_to_transaction(offsets, metadata, CALL_TIMEOUT),
            "send_offsets_to_transaction",
        )
    except KafkaSinkError as exc:
        if _fenced(exc):  # nothing to abort: the producer is done for, and is dropped
            raise _StaleProducerError(str(exc)) from exc
        raise


def _log_marker(producer: Producer, marker: _MarkerGroup, task: TaskIdentity) -> None:
    """The marker log record, as the transaction's first record, before any row: a new
    producer looks the log topic up and registers its partition with the transaction
    while the task still waits for rows, not inside commit (a record produced just
    before ``commit_transaction()`` held some commits up ~100 ms on a new producer)."""
    topic, key, value = marker.log_record(task.batch_id + 1, task.query_id)
    producer.produce(topic, value, key, partition=0)


def _finish(
    producer: Producer,
    task: TaskIdentity,
    batches: Iterator[list[Row]],
    sid: str,
    steps: timing.TaskSteps,
) -> int:
    """The records, then commit (the marker's offset and log record are in already)."""
    count = _produce(producer, batches)
    faults.point("after-prepare", task.batch_id, role="worker", query=task.query_name)
    began = time.perf_counter()
    _call(lambda: producer.commit_transaction(CALL_TIMEOUT), "commit_transaction")
    steps.add("commit", began)
    timing.record_commit(sid, task.batch_id, 1, time.perf_counter() - began)
    return count


def _fenced(exc: KafkaSinkError) -> bool:
    cause = exc.__cause__
    return isinstance(cause, KafkaException) and _fatal(error_of(cause))


def _fatal(error: KafkaError) -> bool:
    return error.code() in FENCED_CODES or error.fatal()


def _produce(producer: Producer, batches: Iterator[list[Row]]) -> int:
    """Produce every row; poll(0) keeps delivery reports flowing, a full queue waits."""
    count = 0
    produce = producer.produce
    for batch in batches:
        for topic, value, key, partition, headers in batch:
            kwargs: dict[str, Any] = {}
            if partition is not None:
                kwargs["partition"] = partition
            if headers:
                kwargs["headers"] = headers
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
    if _fatal(error) or error.code() == KafkaError._FATAL:
        try:
            producer.abort_transaction(10)  # returns at once, with the fatal error
        except KafkaException as fatal:  # a plain producer's says only "not transactional"
            if _fatal(error_of(fatal)):
                reason = error_of(fatal).str()
    return KafkaSinkError(f"Producing a record to topic {topic!r} failed: {reason}")


def _call(call: Callable[[], T], what: str) -> T:
    """Run a transactional call, retrying only what librdkafka marks retriable."""
    for attempt in range(RETRIES):
        try:
            return call()
        except KafkaException as exc:
            error = error_of(exc)
            action = classify(error)
            if action is Action.RETRY and attempt < RETRIES - 1:
                log.warning("%s: %s; retrying", what, error.str())
                time.sleep(min(2.0, 0.2 * 2**attempt))
                continue
            raise KafkaSinkError(f"{what} failed ({action.value}): {error.str()}") from exc
    raise AssertionError("unreachable")


def _abort_quietly(producer: Producer) -> None:
    try:
        producer.abort_transaction(CALL_TIMEOUT)
    except KafkaException as exc:
        log.warning("abort_transaction after a failure: %s", error_of(exc).str())


class KafkaPlainWriter(DataSourceStreamArrowWriter):
    """At-least-once: an idempotent (non-transactional) producer; a replay writes again.

    The producer is the worker's (:class:`PlainProducers`): a new idempotent producer
    waits ~500 ms for its producer id before its first delivery (measured on the local
    broker: flush of 2,500 records 500-520 ms on a new producer, 2-12 ms on one kept).
    """

    def __init__(self, options: KafkaSinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        """Task: produce every row with the worker's producer and wait for delivery."""
        return self.write_rows(iterator)

    def write_rows(
        self, iterator: Iterator[pa.RecordBatch], pool: PlainProducers | None = None
    ) -> WriterCommitMessage:
        """Task: 1. the worker's producer; 2. produce the rows; 3. flush, and fail on any
        record not delivered; 4. give the producer back (after an error it is dropped)."""
        pool = pool or PLAIN_PRODUCERS
        steps = timing.TaskSteps("sink write", current_batch(), rest="produce")
        producer, delivery = pool.take(self.options)
        steps.add("client set-up", steps.began)
        try:
            _produce(producer, rows(steps.pulled("waiting for rows", iterator), self.options.topic))
            since = time.perf_counter()
            remaining = producer.flush(CALL_TIMEOUT)
            steps.add("flush", since)
            if remaining or delivery.failures:
                raise KafkaSinkError(
                    f"{remaining} records undelivered after {CALL_TIMEOUT:.0f} s, "
                    f"{delivery.failed} failed (first: {delivery.failures[:1]}); the task "
                    "fails so Spark retries it (at-least-once: delivered records stay)."
                )
        except BaseException:
            pool.discard(producer)
            raise
        finally:
            steps.record()
        pool.give_back(self.options, producer, delivery)
        return WriterCommitMessage()


class _Deliveries:
    """A pooled plain producer's delivery reports: librdkafka reports failed records only
    (``delivery.report.only.error``), so no Python runs per delivered record."""

    def __init__(self) -> None:
        self.failed = 0
        self.failures: list[str] = []  # the first few, for the error message

    def __call__(self, error: Any, _message: Any) -> None:
        if error is not None:
            self.failed += 1
            if len(self.failures) < 3:
                self.failures.append(str(error))

    def clear(self) -> None:
        self.failed, self.failures = 0, []


class PlainProducers:
    """Task side: one Python worker's idle at-least-once producers, by client settings.

    A task takes one out and gives it back after every record was delivered; after
    anything else it is purged and dropped, so a failed task's queued records are not
    sent by the next task's flush. At most ``size`` stay idle.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._idle: OrderedDict[str, tuple[Producer, _Deliveries]] = OrderedDict()
        self.created = 0  # for tests

    def take(self, options: KafkaSinkOptions) -> tuple[Producer, _Deliveries]:
        idle = self._idle.pop(settings_digest(options.producer_config()), None)
        if idle is not None:
            idle[1].clear()
            return idle
        self.created += 1
        delivery = _Deliveries()
        config = {**options.producer_config(), "delivery.report.only.error": True}
        return Producer({**config, "on_delivery": delivery, "logger": LIBRDKAFKA_LOG}), delivery

    def give_back(
        self, options: KafkaSinkOptions, producer: Producer, delivery: _Deliveries
    ) -> None:
        self._idle[settings_digest(options.producer_config())] = (producer, delivery)
        while len(self._idle) > self.size:  # the least recently used goes (all delivered)
            self._idle.popitem(last=False)

    def discard(self, producer: Producer) -> None:
        """Drop a failed task's producer with whatever it still holds."""
        producer.purge()


#: This Python worker's at-least-once producers.
PLAIN_PRODUCERS = PlainProducers()
