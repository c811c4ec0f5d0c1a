"""The Kafka sink's task side: one transaction per task, fenced and marked with its batch.

librdkafka cannot prepare a transaction in one process and commit it in another,
so each task commits its own transaction: the records and, inside the same
transaction, a progress marker (the committed offset ``batch + 1`` of a
sink-owned consumer group). A retry or a replay first fences every earlier
producer of its (sink, task partition) with ``init_transactions()`` (which also
ends their open transactions), then reads the marker: a batch already marked is
not written again. The same transaction also writes the marker as a record, keyed
by the transactional id, to a compacted *marker log* topic: group offsets expire
(``offsets.retention.minutes``) once a sink stops, the log never does, so a
marker missing from the group is looked up there before a batch counts as new.
Both carry the query id that wrote them: a marker of another query (a new
checkpoint, or a second query, with the same ``sinkId``) fails the task instead
of skipping its batches.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pyarrow as pa
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage

from connectors import faults, timing
from connectors.context import TaskIdentity
from connectors.errors import EosError
from connectors.protocol import Lineage, SinkClaimedError, derive_sink_id
from connectors.topics import read_to_end
from sinks.kafka.errors import Action, classify, error_of
from sinks.kafka.options import KafkaSinkOptions, transactional_id
from sinks.kafka.records import Row, rows

log = logging.getLogger(__name__)

T = TypeVar("T")
CALL_TIMEOUT = 60.0
RETRIES = 5


class KafkaSinkError(EosError):
    """The Kafka sink could not complete a task's transaction."""


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

    def write_task(self, task: TaskIdentity, iterator: Iterator[pa.RecordBatch]) -> TaskReport:
        """Task: 1. fence; 2. read the marker; 3. produce; 4. mark in the transaction;
        5. commit."""
        began = time.perf_counter()
        sid = sink_id(self.options, task.query_id)
        name = transactional_id(self.options, sid, task.partition)
        producer = _fenced_producer(self.options, name)
        marker = _MarkerGroup(self.options, name)
        try:
            done, owner = marker.read()
            if owner and owner != task.query_id:
                raise SinkClaimedError(sid, Lineage(owner), task.query_id)
            if done > task.batch_id:
                log.info("batch %d partition %d is marked: skipping", task.batch_id, task.partition)
                return TaskReport(task.batch_id, task.partition, 0, skipped=True)
            faults.point("before-prepare", task.batch_id, role="worker", query=task.query_name)
            count = _transaction(producer, marker, task, rows(iterator, self.options.topic), sid)
        finally:
            marker.close()
            timing.record_task("sink write", task.batch_id, time.perf_counter() - began)
        faults.point("after-commit", task.batch_id, role="worker", query=task.query_name)
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
        self.consumer = Consumer(
            {
                **options.client_config(),
                "group.id": group,
                "isolation.level": "read_committed",  # only committed markers count
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
        saved = json.loads(mine[-1].value)
        return int(saved["next_batch"]), str(saved["query"])

    def log_record(self, next_batch: int, query_id: str) -> tuple[str, bytes, bytes]:
        """(topic, key, value) of the marker record the transaction writes to the log."""
        value = json.dumps({"next_batch": next_batch, "query": query_id, "topic": self.topic})
        return self.options.marker_log, self.group.encode(), value.encode()

    def offset(self, next_batch: int, query_id: str) -> TopicPartition:
        return TopicPartition(self.topic, 0, next_batch, metadata=query_id)

    def group_metadata(self) -> Any:
        return self.consumer.consumer_group_metadata()

    def close(self) -> None:
        self.consumer.close()


def _fenced_producer(options: KafkaSinkOptions, name: str) -> Producer:
    """A fresh producer per task and batch; init_transactions() fences every older one."""
    producer = Producer({**options.producer_config(), "transactional.id": name})
    # A metadata request first: init_transactions() on a producer with no broker
    # connection up yet waited ~500 ms (librdkafka's coordinator query timer) one time
    # in three, in every task of every batch; connected first it takes a few ms.
    _call(lambda: producer.list_topics(timeout=CALL_TIMEOUT), "metadata")
    _call(lambda: producer.init_transactions(CALL_TIMEOUT), "init_transactions")
    return producer


def _transaction(
    producer: Producer,
    marker: _MarkerGroup,
    task: TaskIdentity,
    batches: Iterator[list[Row]],
    sid: str,
) -> int:
    _call(producer.begin_transaction, "begin_transaction")
    try:
        count = _produce(producer, batches)
        topic, key, value = marker.log_record(task.batch_id + 1, task.query_id)
        producer.produce(topic, value, key, partition=0)
        offsets = [marker.offset(task.batch_id + 1, task.query_id)]
        metadata = marker.group_metadata()
        _call(
            lambda: producer.send_offsets_to_transaction(offsets, metadata, CALL_TIMEOUT),
            "send_offsets_to_transaction",
        )
        faults.point("after-prepare", task.batch_id, role="worker", query=task.query_name)
        began = time.perf_counter()
        _call(lambda: producer.commit_transaction(CALL_TIMEOUT), "commit_transaction")
        timing.record_commit(sid, task.batch_id, 1, time.perf_counter() - began)
    except Exception:  # a crash (or a simulated one) leaves it open, for fencing to end
        _abort_quietly(producer)
        raise
    return count


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
        count += len(batch)
        producer.poll(0)
    return count


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
    """At-least-once: an idempotent (non-transactional) producer; a replay writes again."""

    def __init__(self, options: KafkaSinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        failures: list[str] = []

        def delivered(error: Any, _message: Any) -> None:
            if error is not None:
                failures.append(str(error))

        producer = Producer({**self.options.producer_config(), "on_delivery": delivered})
        _produce(producer, rows(iterator, self.options.topic))
        remaining = producer.flush(CALL_TIMEOUT)
        if remaining or failures:
            raise KafkaSinkError(
                f"{remaining} records undelivered after {CALL_TIMEOUT:.0f} s, "
                f"{len(failures)} failed (first: {failures[:1]})"
            )
        return WriterCommitMessage()
