"""What the Kafka sink's tests share: a task's identity and rows, slow rows, a writer with a
short transaction timeout, and what a reader sees."""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException
from pyspark.sql import SparkSession

from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.kafka_config import KafkaConfig
from eos_connectors.core.topics import Record, create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness.data import produce_words
from eos_connectors.sinks.kafka.checks import check_broker
from eos_connectors.sinks.kafka.clients import LIBRDKAFKA_LOG, fenced_producer
from eos_connectors.sinks.kafka.coordinator import OpenTransaction, TransactionClient
from eos_connectors.sinks.kafka.exactly_once import KafkaExactlyOnceWriter, begin
from eos_connectors.sinks.kafka.marker import MarkerGroup
from eos_connectors.sinks.kafka.options import KafkaSinkOptions, ids_prefix
from eos_connectors.sinks.kafka.options import parse_options as sink_options
from tests.sink_util import stream_into
from tests.source_util import wait_for

_TASK_IDS = itertools.count(1)


def a_task(
    batch: int,
    run: str = "run-1",
    partition: int = 0,
    query: str = "kafka-query",
    attempt: int | None = None,
) -> TaskIdentity:
    """A task of ``batch``; a new task attempt id each call unless ``attempt`` is given."""
    attempt_id = next(_TASK_IDS) if attempt is None else attempt
    return TaskIdentity(query, "kafka", run, batch, partition, attempt_id)


def rows_of(batch: int) -> list[pa.RecordBatch]:
    values = [f"b{batch}-r{i}".encode() for i in range(50)]
    keys = [f"k{i % 5}".encode() for i in range(50)]
    return [pa.RecordBatch.from_arrays([pa.array(keys), pa.array(values)], ["key", "value"])]


def paused(batch: pa.RecordBatch, meanwhile: Callable[[], None]) -> Iterator[pa.RecordBatch]:
    """A task's rows that pause it past its marker check, before its first record: the
    first (empty) batch is pulled ahead while the task checks (RowsAhead), and
    ``meanwhile`` runs when the task asks for more."""
    yield batch.slice(0, 0)
    meanwhile()
    yield batch


#: A transaction between its end and its markers (KIP-664's states).
_ENDING = ["PrepareCommit", "PrepareAbort"]


def wait_for_markers(kafka: KafkaConfig, prefix: str, timeout: float = 10.0) -> None:
    """Wait until no transaction whose id starts with ``prefix`` is ending: EndTxn returns
    once the coordinator logged its PrepareCommit (or PrepareAbort), and the markers reach
    the partitions after that, so a read_committed read made at once may stop below them
    (a CI run read 600 of 1,000 committed records). A test that reads what a commit made
    visible calls this first; one that reads while transactions stay open may too."""
    client = TransactionClient(kafka, timeout_s=timeout)

    def ending() -> list[str]:
        return [i for i in client.listed(_ENDING) if i.startswith(prefix)]

    try:
        wait_for(lambda: not ending(), "the ended transactions' markers", ending, timeout)
    finally:
        client.close()


def read_written(kafka: KafkaConfig, topic: str, **how: Any) -> list[Record]:
    """What a sink wrote to ``topic``, every ended transaction's markers in first (any
    sink's: :func:`wait_for_markers` for all ids), as :func:`read_to_end` reads it."""
    wait_for_markers(kafka, "")
    return read_to_end(kafka, topic, **how)


def values_read(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter, isolation: str
) -> list[bytes]:
    topic = writer.options.topic
    assert topic is not None
    return sorted(r.value for r in read_to_end(endpoints.kafka, topic, isolation))


def expected_values(batches: range) -> list[bytes]:
    return sorted(v for b in batches for v in rows_of(b)[0].column("value").to_pylist())


def wait_for_metadata_quiet(producer: Any, caplog: Any, answered: str) -> None:
    """Polls the producer (it serves librdkafka's log queue) until the topic's look-up
    was answered and every topic request since has its answer, for 1 s in a row: the
    look-up registers the topic, and librdkafka may or may not query its leaders once
    more, depending on which answer comes first. 10 s at most."""
    deadline, quiet_since, seen = time.monotonic() + 10, time.monotonic(), -1
    while True:
        lines = [r.getMessage() for r in caplog.records]
        asked = sum("Request metadata for 1 topic" in line for line in lines)
        answers = sum(answered in line for line in lines)
        if len(lines) != seen:
            seen, quiet_since = len(lines), time.monotonic()
        settled = answers >= 1 and answers >= asked
        if settled and time.monotonic() - quiet_since >= 1:
            return
        assert time.monotonic() < deadline, f"the look-up never settled: {lines[-5:]}"
        producer.poll(0.05)


def fenced_lines(writer: KafkaExactlyOnceWriter, name: str, caplog: Any) -> list[str]:
    """What librdkafka logs through the sink's logger when a pooled producer of ``name``,
    fenced by a newer one, starts a transaction."""
    caplog.clear()
    old = fenced_producer(writer.options, name)
    newer = fenced_producer(writer.options, name)
    marker = MarkerGroup(writer.options, name)
    with pytest.raises(Exception, match=r"(?i)fenced"):
        begin(old, marker, a_task(0))
    with contextlib.suppress(KafkaException):  # poll() raises the fatal error too
        old.poll(1)  # serves the log lines librdkafka queued
    marker.close()
    del old, newer
    return [r.getMessage() for r in caplog.records if r.name == LIBRDKAFKA_LOG.name]


def marker_groups(writer: KafkaExactlyOnceWriter) -> list[str]:
    from eos_connectors.sinks.kafka.options import transactional_id

    sink_id = writer.options.sink_id
    assert sink_id is not None
    return [transactional_id(writer.options, sink_id, 0)]


def write(
    spark: SparkSession,
    endpoints: Endpoints,
    source: str,
    tmp_path: Path,
    select: list[str],
    **options: str,
) -> None:
    sink = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, **options}
    stream_into(spark, endpoints, source, tmp_path, select, "eos_kafka", **sink)


def source_topics(endpoints: Endpoints, unique: str) -> tuple[str, str]:
    source, out = f"ks-in-{unique}", f"ks-out-{unique}"
    create_topic(endpoints.kafka, source, partitions=3)
    create_topic(endpoints.kafka, out, partitions=2)
    produce_words(endpoints.kafka_bootstrap, source, 500, seed=len(unique))
    return source, out


def java_partitions(endpoints: Endpoints, keys: list[bytes], unique: str) -> dict[bytes, int]:
    """Where a Java producer with its default partitioner puts ``keys`` on a topic of two
    partitions (the broker's own kafka-clients jar; ``tests/java/JavaKeyedProducer.java``)."""
    import subprocess

    from eos_connectors.dev.stack.kafka import ensure_jars

    topic = f"ks-java-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    program = Path(__file__).resolve().parent / "java" / "JavaKeyedProducer.java"
    command = ["java", "-cp", f"{ensure_jars()}/*", str(program), endpoints.kafka_bootstrap, topic]
    done = subprocess.run(
        command, input=b"\n".join(keys) + b"\n", capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return {r.key: r.partition for r in read_to_end(endpoints.kafka, topic) if r.key}


def late(batches: list[pa.RecordBatch], before: float, between: float = 0.0) -> Iterator[Any]:
    """Rows Spark hands over late: ``before`` seconds before the first batch (upstream work),
    ``between`` seconds after each one."""
    time.sleep(before)
    for batch in batches:
        yield batch
        time.sleep(between)


def claim_owner(options: KafkaSinkOptions, sink_id: str) -> str:
    """The query holding the sink id's claim as its group reads stably, or ""."""
    from eos_connectors.sinks.kafka.claim import claim_name, read_claim
    from eos_connectors.sinks.kafka.marker import marker_consumer

    consumer = marker_consumer(options, claim_name(options, sink_id), "read_committed")
    try:
        return read_claim(options, sink_id, consumer)[0]
    finally:
        consumer.close()


def new_sink_options(
    endpoints: Endpoints, prefix: str, unique: str, **extra: str
) -> KafkaSinkOptions:
    """A Kafka sink on a new two-partition topic ``<prefix>-<unique>`` (its sinkId too),
    with ``extra`` options, its marker log made as the driver's start check makes it."""
    name = f"{prefix}-{unique}"
    create_topic(endpoints.kafka, name, 2)
    options = sink_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "topic": name,
            "sinkId": name,
            **extra,
        }
    )
    check_broker(options)
    return options


def short_timeout_writer(endpoints: Endpoints, unique: str) -> KafkaExactlyOnceWriter:
    # 3 s: the task's own work must fit in it on a loaded 2-core CI machine (2 s aborted
    # the transaction of a task that wrote 50 rows, ci97).
    extra = {"kafka.transaction.timeout.ms": "3000"}
    return KafkaExactlyOnceWriter(new_sink_options(endpoints, "ks-timeout", unique, **extra))


def opened_with(
    client: TransactionClient, options: KafkaSinkOptions, records: int
) -> OpenTransaction:
    """An open transaction of the sink ``options``, once ``records`` records reached its
    topic's partitions (open, not yet visible)."""
    from confluent_kafka import Consumer, TopicPartition

    topic, sink_id = options.topic, options.sink_id
    assert topic is not None and sink_id is not None
    uncommitted = {"group.id": "unused", "isolation.level": "read_uncommitted"}
    reader = Consumer({**options.kafka, **uncommitted})
    try:
        partitions = list(reader.list_topics(topic, 10).topics[topic].partitions)
        deadline = time.monotonic() + 30
        while True:
            found = client.open_transactions(ids_prefix(options, sink_id))
            ends = [
                reader.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in partitions
            ]
            if found and sum(ends) >= records:
                return found[0]
            assert time.monotonic() < deadline, "the task's records never reached the log"
            time.sleep(0.05)
    finally:
        reader.close()


def wait_until_ended(client: TransactionClient, transactional_id: str) -> None:
    """Wait until ``transactional_id``'s transaction has ended (its markers written): its
    coordinator describes it complete, or the id fenced and ready for a new one."""
    deadline = time.monotonic() + 30
    ended = {"CompleteAbort", "CompleteCommit", "Empty"}
    while str(client.describe([transactional_id])[transactional_id].state.value) not in ended:
        assert time.monotonic() < deadline, f"{transactional_id}'s transaction never ended"
        time.sleep(0.05)
