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
open transaction.

A task looks where its task partition stands before any transaction, while Spark
computes its rows: a *quick* read of the marker (as the group last applied it)
refuses another query's task partition before fencing anybody, skips a marked
batch, and shows whether a pooled producer's marker moved since the producer's
own last commit (another producer of the id moved it, so fenced it: a new one is
made now, not after the rows came). A new producer is followed by a *stable*
read (``require_stable``: a broker applies a committed transaction's offsets
after it answered the commit), the only read trusted to say what to write. The
transaction begins at the first row, so time spent upstream before it does not
count against ``transaction.timeout.ms``, and a task with no rows opens none. A
pooled producer fenced without the marker moving (another attempt initialised
one and wrote nothing) fails at the transaction's first call, the marker's
offset, before any record: the task takes a new producer and looks again.

The same transaction also writes the marker as a record, keyed by the
transactional id, to a compacted *marker log* topic: group offsets expire
(``offsets.retention.minutes``) once a sink stops, the log never does, so a
marker missing from the group is looked up there before a batch counts as new.
Both carry the query id that wrote them: a marker of another query (a new
checkpoint, or a second query, with the same ``sinkId``) fails the task instead
of skipping its batches, and a task partition with no marker of its own query
first makes sure the sink id is its query's (:mod:`sinks.kafka.claim`).
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
from connectors.protocol import Lineage, SinkClaimedError
from connectors.secrets import settings_digest
from connectors.topics import read_to_end
from sinks.kafka.claim import ensure_claimed
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
    return options.sink_id_for(query_id)


class KafkaTransactionalWriter(DataSourceStreamArrowWriter):
    """Exactly-once under deterministic replay.

    Guarantee: a task's records become visible to read_committed readers when
    its transaction commits, before Spark completes the batch; every record is
    written exactly once, provided a replayed batch gives each task partition the
    same records (true for eos_kafka input, whose offsets record how each batch is
    split into tasks, and deterministic stages).
    """

    def __init__(self, options: KafkaSinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        """Task: Spark's entry point; see :meth:`write_task`."""
        return self.write_task(TaskIdentity.current(), iterator)

    def write_task(
        self, task: TaskIdentity, iterator: Iterator[pa.RecordBatch], pool: ClientPool | None = None
    ) -> TaskReport:
        """Task: 1. the worker's pooled producer and marker consumer for the task partition,
        if it has them; 2-5. the transaction (:meth:`_attempts`); 6. back to the pool.
        Spark's first rows are pulled on a thread meanwhile (:class:`RowsAhead`)."""
        steps = timing.TaskSteps("sink write", task.batch_id, rest="produce")
        pool = pool or CLIENTS
        sid = sink_id(self.options, task.query_id)
        name = transactional_id(self.options, sid, task.partition)
        with RowsAhead(iterator) as ahead:
            rows_in = _FirstRows(steps.pulled("waiting for rows", iter(ahead)))
            pooled, marker = pool.take(self.options, name)
            try:
                report, producer = self._attempts(pooled, marker, task, rows_in, sid, steps,
                                                  pool)  # fmt: skip
            except BaseException:
                pool.discard(marker)
                raise
            finally:
                steps.record()
        if producer is not None:
            pool.give_back(self.options, name, producer, marker)
        else:  # a marked batch that needed no producer
            pool.discard(marker)
        faults.point("after-commit", task.batch_id, role="worker", query=task.query_name)
        return report

    def _attempts(self, pooled: Producer | None, marker: _MarkerGroup, task: TaskIdentity,
                  rows_in: _FirstRows, sid: str, steps: timing.TaskSteps,
                  pool: ClientPool) -> tuple[TaskReport, Producer | None]:  # fmt: skip
        """Task: 2. where the task partition stands (:meth:`_stand`): its marker read stably,
        its owner checked, a producer fenced in where needed, all before any transaction;
        3. a marked batch, or no rows, ends here with no transaction; 4. at the first row,
        the transaction; 5. a pooled producer found fenced there after all (another
        attempt initialised one and wrote nothing) is replaced, and 2-4 run again."""
        producer, fresh = pooled, False
        while True:
            since = time.perf_counter()
            producer, fresh = self._stand(producer, fresh, marker, task, sid, pool)
            steps.add("marker and producer", since)
            done, _owner = marker.known or (0, "")
            if done > task.batch_id:
                log.info("batch %d partition %d is marked: skipping", task.batch_id,
                         task.partition)  # fmt: skip
                return TaskReport(task.batch_id, task.partition, 0, skipped=True), producer
            if rows_in.first() is None:
                return TaskReport(task.batch_id, task.partition, 0, skipped=False), producer
            assert producer is not None
            try:
                return self._attempt(producer, marker, task, rows_in, sid, steps), producer
            except _StaleProducerError as exc:
                if fresh:
                    raise
                log.info("pooled producer %s is stale (%s): initialising a new one",
                         marker.group, exc)  # fmt: skip
                producer, marker.known = None, None

    def _stand(self, producer: Producer | None, fresh: bool, marker: _MarkerGroup,
               task: TaskIdentity, sid: str,
               pool: ClientPool) -> tuple[Producer | None, bool]:  # fmt: skip
        """Task: a quick read of the marker first, to refuse another query's task
        partition before fencing anybody and to skip a marked batch with no producer; a
        pooled producer whose marker moved since its own last commit (another producer of
        the id moved it, so fenced it) is dropped; a task without a producer gets a new
        one, fenced in, and reads the marker stably: only a read after its own
        init_transactions() is trusted to say what to write."""
        quick = marker.read_quick()
        self._check_owner(quick, task, sid)
        if producer is not None and _moved(quick, marker.known):
            log.info("marker %s moved since this worker's last batch: its producer is fenced",
                     marker.group)  # fmt: skip
            producer = None
        if producer is None and quick is not None and quick[0] > task.batch_id:
            marker.known = quick  # marked (markers only move forward): no producer needed
            return producer, fresh
        if producer is None:
            producer, fresh = pool.new_producer(self.options, marker.group), True
            marker.known = marker.read()
            self._check_owner(marker.known, task, sid)
        return producer, fresh

    def _check_owner(self, marker: tuple[int, str] | None, task: TaskIdentity,
                     sid: str) -> None:  # fmt: skip
        """SinkClaimedError when another query marked the task partition, or holds the
        sink's claim: looked up (and taken, if free) when the marker names no query yet,
        the task partition's first batch or its first since a reset."""
        owner = marker[1] if marker is not None else ""
        if owner and owner != task.query_id:
            raise SinkClaimedError(sid, Lineage(owner), task.query_id)
        if not owner:
            ensure_claimed(self.options, sid, task.query_id)

    def _attempt(self, producer: Producer, marker: _MarkerGroup, task: TaskIdentity,
                 rows_in: _FirstRows, sid: str, steps: timing.TaskSteps) -> TaskReport:  # fmt: skip
        """Begin with the marker's offset (a stale producer fails here, before any record),
        the marker log record, the rows, commit."""
        since = time.perf_counter()
        _begin(producer, marker, task)
        began = time.monotonic()
        try:
            steps.add("begin and marker", since)
            _log_marker(producer, marker, task)
            faults.point("before-prepare", task.batch_id, role="worker", query=task.query_name)
            batches = rows(rows_in.all(), self.options.topic)
            count = _finish(producer, task, batches, sid, steps)
            marker.known = (task.batch_id + 1, task.query_id)
        except Exception as exc:  # a crash (or a simulated one) leaves it open, for fencing
            _abort_quietly(producer)
            _explain_timeout(exc, self.options, time.monotonic() - began)
            raise
        return TaskReport(task.batch_id, task.partition, count, skipped=False)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: nothing to do: each task committed its own transaction."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: nothing to do: an unfinished task transaction is aborted by the next
        attempt's init_transactions(), or by the broker after transaction.timeout.ms."""


def _moved(quick: tuple[int, str] | None, known: tuple[int, str] | None) -> bool:
    """Whether another producer of the id moved the marker past what this one last
    committed (so fenced it), or a reset removed it. A marker behind the known one is
    this producer's own commit not yet applied by the group: not a move."""
    if quick is None:  # no marker in the group: moved unless this one never wrote either
        return known != (0, "")
    if known is None:
        return True
    return quick[1] != known[1] or quick[0] > known[0]


class _FirstRows:
    """Task side: Spark's Arrow batches with the first one holding rows looked at before
    the transaction begins (so time spent upstream before the first row does not count
    against ``transaction.timeout.ms``, and a task with no rows opens no transaction)."""

    def __init__(self, batches: Iterator[pa.RecordBatch]) -> None:
        self._batches = batches
        self._first: pa.RecordBatch | None = None
        self._looked = False

    def first(self) -> pa.RecordBatch | None:
        """The first batch with rows, None when there is none (waits for Spark)."""
        if not self._looked:
            self._looked = True
            self._first = next((b for b in self._batches if b.num_rows), None)
        return self._first

    def all(self) -> Iterator[pa.RecordBatch]:
        first = self.first()
        if first is not None:
            yield first
            yield from self._batches


def _explain_timeout(exc: Exception, options: KafkaSinkOptions, open_seconds: float) -> None:
    """A transaction open longer than ``transaction.timeout.ms`` is aborted by the broker,
    which bumps the producer's epoch: the next call fails as fenced. Say which setting to
    raise instead of leaving "fenced by a newer instance"."""
    if not isinstance(exc, KafkaSinkError) or not _fenced(exc):
        return
    if open_seconds * 1000 < options.transaction_timeout_ms:
        return
    raise KafkaSinkError(
        f"The task's transaction was open {open_seconds:.1f} s, longer than "
        f"kafka.transaction.timeout.ms ({options.transaction_timeout_ms} ms), so the broker "
        "aborted it; nothing of it is visible and Spark retries the task. Raise the option "
        "kafka.transaction.timeout.ms above the time a task takes to write its rows (at most "
        "the broker's transaction.max.timeout.ms)."
    ) from exc


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
        # committed() asks for the committed offset with require_stable under
        # read_committed: a broker applies a committed transaction's offsets after it
        # answered the commit (Kafka 3.x), and a stable read waits for them instead of
        # returning the marker before them. It also waits while a transaction of the id
        # is open, so it is made only after this task's own init_transactions() ended
        # any such transaction (and before it begins its own).
        self.stable = _marker_consumer(options, group, "read_committed")
        # The quick read returns the marker as the group last applied it, never waiting:
        # a pooled producer checks with it whether its marker moved (then it was fenced)
        # and a task whether another query wrote it, before it fences anybody.
        self.quick = _marker_consumer(options, group, "read_uncommitted")

    def read(self) -> tuple[int, str]:
        """(batches done, the query id that marked them), read stably: (0, "") before any
        marker. A broker error is raised with its code, never read as "nothing done"."""
        marked = self._committed(self.stable)
        if marked is None:  # never marked, or the group's offsets expired
            return self.read_log()
        return marked

    def read_quick(self) -> tuple[int, str] | None:
        """The marker as the group last applied it, without waiting for a transaction that
        is committing or open; None when the group holds none (the log is not read)."""
        return self._committed(self.quick)

    def _committed(self, consumer: Consumer) -> tuple[int, str] | None:
        position = TopicPartition(self.topic, 0)
        marked = _call(lambda: consumer.committed([position], timeout=CALL_TIMEOUT),
                       f"reading marker {self.group}")[0]  # fmt: skip
        if marked.error is not None:
            raise KafkaSinkError(
                f"Reading the progress marker of {self.group} on {self.topic} failed "
                f"({marked.error.name()}): {marked.error.str()}. Nothing was written; the "
                "task fails so Spark retries it."
            )
        if marked.offset < 0:
            return None
        return int(marked.offset), marked.metadata or ""

    def read_log(self) -> tuple[int, str]:
        """The task partition's last marker in the marker log (read_committed, up to the high
        watermark once every transaction open now has ended: other tasks' transactions
        write the log too, and one still open must not hide a marker committed after it
        began): (0, "") when it never wrote one."""
        options = self.options
        try:
            records = read_to_end(
                options.bootstrap_servers,
                options.marker_log,
                settings=options.client_config(),
                timeout=CALL_TIMEOUT,
                settled=True,
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
        return self.stable.consumer_group_metadata()

    def close(self) -> None:
        self.stable.close()
        self.quick.close()


def _marker_consumer(options: KafkaSinkOptions, group: str, isolation: str) -> Consumer:
    return Consumer(
        {
            **CONNECT_AT_ONCE,
            **options.client_config(),
            "group.id": group,
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "log_level": 4,
        }
    )


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

    def take(self, options: KafkaSinkOptions, name: str) -> tuple[Producer | None, _MarkerGroup]:
        """``name``'s idle producer and marker consumer, taken out of the pool, or no
        producer (the task fences one in once it has read the marker) and a new consumer."""
        idle = self._idle.pop(_pool_key(options, name), None)
        if idle is not None:
            return idle
        return None, _MarkerGroup(options, name)

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
