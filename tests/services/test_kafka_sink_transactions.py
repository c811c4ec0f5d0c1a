"""The Kafka sink's task steps on the real broker: a task crashed at each of its points and
replayed, zombie attempts fenced, pooled producers across workers. Driven without Spark
(``KafkaExactlyOnceWriter.write_task``); the conformance cells crash it inside pipelines.

Cost: ~22 s (the abort of a stopped batch: 5 s; a task woken after the abort: 2 s)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException

from eos_connectors.core import faults
from eos_connectors.core.kafka_config import Transient
from eos_connectors.core.timing import TaskSteps
from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness.checks import open_transactions
from eos_connectors.sinks.kafka.at_least_once import KafkaAtLeastOnceWriter
from eos_connectors.sinks.kafka.clients import LIBRDKAFKA_LOG, fenced_producer
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.exactly_once import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.marker import MarkerGroup
from eos_connectors.sinks.kafka.options import parse_options as sink_options
from eos_connectors.sinks.kafka.options import transactional_id
from eos_connectors.sinks.kafka.pool import ClientPool, PlainProducers
from tests.kafka_sink_util import (
    a_task,
    expected_values,
    fenced_lines,
    opened_with,
    paused,
    rows_of,
    values_read,
    wait_until_ended,
)

pytestmark = pytest.mark.services


@pytest.mark.parametrize("point", ["before-prepare", "after-prepare", "after-commit"])
def test_a_task_crashed_at_each_point_then_replayed_writes_once(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter, point: str
) -> None:
    writer.write_task(a_task(0), iter(rows_of(0)))
    with pytest.raises(faults.SimulatedCrash), faults.simulate(f"{point}@1"):
        writer.write_task(a_task(1), iter(rows_of(1)))
    replay = writer.write_task(a_task(1, run="run-2"), iter(rows_of(1)))
    assert replay.skipped == (point == "after-commit"), "a committed task must not write again"
    writer.write_task(a_task(2, run="run-2"), iter(rows_of(2)))
    assert values_read(endpoints, writer, "read_committed") == expected_values(range(3))
    topic = writer.options.topic
    assert topic is not None
    assert open_transactions(endpoints.kafka_bootstrap, topic) == set(), (
        "a transaction was left open"
    )


def test_a_first_batch_goes_on_beside_another_task_partitions_open_transaction(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter
) -> None:
    """Task-commit mode: task partition 0 wrote batch 0 (its task claimed the sink), then
    its attempt at batch 1 died after its flush, its transaction open on the marker log
    until Spark's retry fences it. Task partition 1's first batch (a partition a retune
    added: no marker in its group, so it reads the marker log) goes on at once instead of
    waiting for that transaction: with every task slot held by such reads, the retry
    never ran (the conformance run's records cell stalled 40 s in CI, until the reads
    timed out and the tasks failed). The retry then writes partition 0's batch 1 once.
    Cost: ~2 s."""
    import time

    options, topic = writer.options, writer.options.topic
    assert topic is not None and options.sink_id is not None
    writer.write_task(a_task(0, partition=0), iter(rows_of(0)))
    # The dead attempt as a killed process leaves it: its marker record and a row
    # flushed in its transaction, nothing ended (librdkafka aborts nothing on exit).
    dead = transactional_id(options, options.sink_id, 0)
    attempt = fenced_producer(options, dead)
    attempt.begin_transaction()
    attempt.produce(options.marker_log, b"{}", dead.encode(), partition=0)
    attempt.produce(topic, b"unfinished", b"k")
    attempt.flush(30)
    assert open_transactions(endpoints.kafka_bootstrap, options.marker_log, timeout=2)
    began = time.monotonic()
    first = writer.write_task(a_task(1, partition=1), iter(rows_of(1)))
    assert not first.skipped
    assert time.monotonic() - began < 15, "the first batch waited for the open transaction"
    retry = writer.write_task(a_task(1, run="run-2", partition=0), iter(rows_of(1)))
    assert not retry.skipped
    once = sorted(expected_values(range(1)) + expected_values(range(1, 2)) * 2)
    # A commit returns before the coordinator's markers reach the partitions: read once
    # they have (a read at once, on a loaded CI machine, ended before the retry's rows);
    # open_transactions waits for the last stable offset to pass a marker of its own.
    assert open_transactions(endpoints.kafka_bootstrap, topic) == set()
    read = values_read(endpoints, writer, "read_committed")
    assert [v for v in read if not v.startswith(b"\x00")] == once  # not the checks'


def test_an_abort_ends_the_open_transaction_of_a_task_spark_stopped_waiting_for(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter
) -> None:
    """Task-commit mode, a batch failed or stopped (``query.stop()``) mid-way: one task
    committed, the other died with its records flushed and its transaction open. Spark's
    abort, which hears only of the finished task, ends the open one from the driver at
    once (before: it held read_committed readers back until ``transaction.timeout.ms``),
    and the replay writes the unfinished task partition once. (Issue 54, item 8.)"""
    options, topic = writer.options, writer.options.topic
    assert topic is not None and options.sink_id is not None
    done = writer.write_task(a_task(0, partition=0), iter(rows_of(0)))
    # The unfinished task: its transaction begun, a record flushed, then no more of it.
    unfinished = fenced_producer(options, transactional_id(options, options.sink_id, 1))
    unfinished.begin_transaction()
    unfinished.produce(topic, b"unfinished", b"k")
    unfinished.flush(30)
    assert open_transactions(endpoints.kafka_bootstrap, topic, timeout=2) != set()
    writer.abort([done, None], 0)
    assert open_transactions(endpoints.kafka_bootstrap, topic, timeout=5) == set()
    replay = [writer.write_task(a_task(0, "run-2", p), iter(rows_of(0))) for p in (0, 1)]
    assert [r.skipped for r in replay] == [True, False]
    once_each = sorted(expected_values(range(1)) * 2)
    read = values_read(endpoints, writer, "read_committed")
    assert [v for v in read if not v.startswith(b"\x00")] == once_each  # not the checks'


def test_a_task_that_writes_on_after_the_drivers_abort_commits_nothing(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter
) -> None:
    """Task-commit mode: a batch fails while one of its tasks still writes (its executor
    frozen), and Spark's abort ends the sink's open transactions from the driver; then
    the task wakes and writes on, to a partition it had not written yet. Had the abort
    been an ``EndTxn(abort)``, which moves no epoch under transaction protocol version 1,
    the producer's next AddPartitionsToTxn would begin a new transaction at the same
    epoch, holding only what came after the abort and no marker, and the task's commit
    would make it visible: the replay writes the whole task partition again, so those
    records twice (25 of 50 here). The abort fences each id instead, so the woken
    producer is refused as fenced: nothing of the task is visible, nothing stays open,
    and the replay writes each record once. Cost: ~2 s."""
    from eos_connectors.sinks.kafka.coordinator import TransactionClient
    from eos_connectors.sinks.kafka.exactly_once import abort_open_transactions

    options, topic = writer.options, writer.options.topic
    assert topic is not None and options.sink_id is not None
    client = TransactionClient(options.kafka)
    rows = rows_of(0)[0]

    def placed(half: slice, partition: int) -> pa.RecordBatch:
        part = rows.slice(half.start, half.stop - half.start)
        at = pa.array([partition] * part.num_rows, pa.int32())
        return pa.RecordBatch.from_arrays([part.column("value"), at], ["value", "partition"])

    def aborted_while_writing() -> Iterator[pa.RecordBatch]:
        yield placed(slice(0, 25), 0)
        txn = opened_with(client, options, 25)
        abort_open_transactions(options, options.sink_id or "", 0)
        wait_until_ended(client, txn.transactional_id)
        yield placed(slice(25, 50), 1)

    try:
        with pytest.raises(KafkaSinkError, match=r"(?i)fenced"):
            writer.write_task(a_task(0, partition=0), aborted_while_writing())

        def visible() -> list[bytes]:
            read = values_read(endpoints, writer, "read_committed")
            return [v for v in read if not v.startswith(b"\x00")]  # not the checks'

        assert visible() == [], "visible after the abort"
        assert open_transactions(endpoints.kafka_bootstrap, topic, timeout=5) == set()
        writer.write_task(a_task(0, "run-2", 0), iter(rows_of(0)))
        assert visible() == expected_values(range(1)), "each record once"
    finally:
        client.close()


def test_a_zombie_attempt_cannot_commit(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter, unique: str
) -> None:
    """Two live producers of one transactional id: the fenced one's records stay invisible."""
    options, out = writer.options, writer.options.topic
    assert out is not None
    name, task = f"zombie-{unique}", a_task(7)
    zombie = fenced_producer(options, name)
    zombie.begin_transaction()
    zombie.produce(out, b"zombie", b"k")
    zombie.flush(30)
    # The retry fences the zombie, finds batch 7 unmarked, and commits its own records.
    marker = MarkerGroup(options, name)
    retry = fenced_producer(options, name)
    assert marker.read() == (0, "")
    from eos_connectors.sinks.kafka.exactly_once import begin, finish, log_marker
    from eos_connectors.sinks.kafka.records import Row

    begin(retry, marker, task)
    log_marker(retry, marker, task, "")
    records: Iterator[list[Row]] = iter([[(out, b"retry", b"k", None, None, None)]])
    finish(retry, task, records, name, TaskSteps("sink write", 7, rest="produce"))
    assert marker.read() == (8, "kafka-query"), "the marker names the query that wrote it"
    marker.close()
    with pytest.raises(KafkaException, match=r"(?i)fenced|epoch"):
        zombie.commit_transaction(30)
    assert values_read(endpoints, writer, "read_committed") == [b"retry"]
    assert values_read(endpoints, writer, "read_uncommitted") == [b"retry", b"zombie"]
    # A third attempt of the same batch sees the marker and writes nothing.
    third = MarkerGroup(options, name)
    assert third.read()[0] > task.batch_id
    third.close()


def test_a_zombie_that_passed_its_marker_check_is_fenced_by_the_retry(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter
) -> None:
    """The zombie stops after reading the marker (batch 3 not done); the retry commits
    batch 3; the zombie wakes and produces: fenced, nothing of it visible. Fenced at its
    commit, it reads the marker again and reports the batch's partition as marked
    (skipped), as it would have had it started after the retry."""
    zombie_task, retry_task = a_task(3), a_task(3, run="run-2")
    woke: list[str] = []

    def retry() -> None:
        # The retry runs its whole transaction while the zombie is between its marker
        # check and its first record.
        writer.write_task(retry_task, iter(rows_of(3)))
        woke.append("zombie")

    report = writer.write_task(zombie_task, paused(rows_of(3)[0], retry))
    assert report.skipped and report.records == 0
    assert woke == ["zombie"]
    assert values_read(endpoints, writer, "read_committed") == expected_values(range(3, 4))


def test_two_workers_fence_each_others_pooled_producer_back_and_forth(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark hands a task partition's batches to whichever worker is free: each worker's
    pooled producer was fenced by the other's in between. The task reads the marker
    before its rows come, finds it moved since its producer's own last commit, takes a
    new producer then (before any row, any transaction) and writes its batch once."""
    first, second = ClientPool(), ClientPool()
    reads: list[str] = []
    read = MarkerGroup.read

    def counted(marker: MarkerGroup) -> tuple[int, str]:
        reads.append(marker.group)
        return read(marker)

    monkeypatch.setattr(MarkerGroup, "read", counted)
    for batch in range(6):
        report = writer.write_task(a_task(batch), iter(rows_of(batch)), (first, second)[batch % 2])
        assert not report.skipped and report.records == 50
    assert (first.created, second.created) == (3, 3), "each fenced pooled producer replaced"
    assert len(reads) == 6, "each new producer reads the marker stably once"
    # Back to back on one worker, the pooled producer is reused: no new one, and the
    # marker it committed last is known without a stable read.
    writer.write_task(a_task(6), iter(rows_of(6)), second)
    assert (second.created, len(reads)) == (3, 6)
    # A late replay of a batch the other worker wrote writes nothing: first's producer
    # (last committed batch 4) was fenced since, so what it remembers is not trusted.
    assert writer.write_task(a_task(5, run="run-2"), iter(rows_of(5)), first).skipped
    assert writer.write_task(a_task(4, run="run-2"), iter(rows_of(4)), first).skipped
    assert values_read(endpoints, writer, "read_committed") == expected_values(range(7))
    topic = writer.options.topic
    assert topic is not None
    assert open_transactions(endpoints.kafka_bootstrap, topic) == set()


def test_at_least_once_producers_are_kept_per_worker_and_dropped_after_a_failure(
    endpoints: Endpoints, unique: str
) -> None:
    """The at-least-once writer reuses its worker's producer (a new idempotent producer
    waits ~500 ms for its id); a record the broker refuses fails the task with the
    count of failed records, and the producer is not kept."""
    topic = f"ks-plain-{unique}"
    create_topic(endpoints.kafka, topic, 2, **{"max.message.bytes": "2000"})
    options = sink_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "topic": topic,
            "deliveryGuarantee": "at-least-once",
        }
    )
    writer, pool = KafkaAtLeastOnceWriter(options), PlainProducers()
    for batch in range(3):
        writer.write_rows(iter(rows_of(batch)), pool)
    assert pool.created == 1, "one producer for three tasks"
    too_large = pa.RecordBatch.from_arrays(
        [pa.array([b"k"]), pa.array([b"x" * 5000])], ["key", "value"]
    )
    refused = r"Kafka refused 1 records .*largest .*key 'k' \(5,000 bytes .*kafka\.batch\.size"
    with pytest.raises(KafkaSinkError, match=refused):
        writer.write_rows(iter([too_large]), pool)
    writer.write_rows(iter(rows_of(3)), pool)
    assert pool.created == 2, "the failed task's producer was dropped, not reused"
    delivered = [r.value for r in read_to_end(endpoints.kafka, topic)]
    assert sorted(delivered) == expected_values(range(4))


def test_a_fenced_pooled_producers_expected_errors_stay_out_of_the_log(
    writer: KafkaExactlyOnceWriter, unique: str, caplog: Any
) -> None:
    """Spark moves task partitions between workers every batch or so: librdkafka's
    FATAL 'fenced by a newer instance' lines are expected then and are dropped; with
    the filter off the same steps log them (so this test sees them)."""
    caplog.set_level(logging.DEBUG, logger=LIBRDKAFKA_LOG.name)
    (expected,) = [f for f in LIBRDKAFKA_LOG.filters if not isinstance(f, Transient)]
    LIBRDKAFKA_LOG.removeFilter(expected)
    try:
        unfiltered = fenced_lines(writer, f"loud-{unique}", caplog)
    finally:
        LIBRDKAFKA_LOG.addFilter(expected)
    assert any("fenced by a newer instance" in line for line in unfiltered), unfiltered
    filtered = fenced_lines(writer, f"quiet-{unique}", caplog)
    assert not any("fenced by a newer instance" in line for line in filtered), filtered


def test_a_pooled_zombie_is_fenced_by_a_retry_on_another_worker(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter
) -> None:
    """Both workers hold a pooled producer. The zombie (worker one, current epoch) passes
    its marker check and stops; the retry on worker two finds the marker moved, takes a
    new producer (fencing the zombie's) and commits; the zombie wakes, is fenced at the
    first call of its transaction, takes a new producer, reads the marker again and
    writes nothing: the batch is in once."""
    first, second = ClientPool(), ClientPool()
    writer.write_task(a_task(0), iter(rows_of(0)), second)
    writer.write_task(a_task(1), iter(rows_of(1)), first)  # first now holds the current epoch
    woke: list[str] = []

    def retry() -> None:
        writer.write_task(a_task(2, run="run-2"), iter(rows_of(2)), second)
        woke.append("zombie")

    zombie = writer.write_task(a_task(2), paused(rows_of(2)[0], retry), first)
    assert woke == ["zombie"]
    assert zombie.skipped, "the zombie found its batch marked once it was fenced"
    assert values_read(endpoints, writer, "read_committed") == expected_values(range(3))
    writer.write_task(a_task(3), iter(rows_of(3)), first)
    assert values_read(endpoints, writer, "read_committed") == expected_values(range(4))
