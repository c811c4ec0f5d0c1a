"""The transactional eos_kafka sink on the real broker: its contract step by step, zombies,
and bad input.

The Kafka sink has no cross-process prepare (librdkafka cannot commit in one process
what another prepared): each task runs one fenced transaction holding its records
and its progress marker. These tests drive a task's steps without Spark
(``KafkaExactlyOnceWriter.write_task``), crash at each of its fault points with
``faults.simulate``, and replay the task as Spark would; the conformance cells
(tests/integration/test_conformance.py) crash it inside real pipelines.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]
from pyspark.sql import SparkSession

from eos_connectors.core import faults
from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.protocol import SinkClaimedError
from eos_connectors.core.timing import TaskSteps
from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness.checks import open_transactions
from eos_connectors.dev.harness.data import produce_words
from eos_connectors.sinks.kafka.at_least_once import KafkaAtLeastOnceWriter
from eos_connectors.sinks.kafka.checks import check_broker
from eos_connectors.sinks.kafka.clients import LIBRDKAFKA_LOG, fenced_producer
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.exactly_once import KafkaExactlyOnceWriter, begin, sink_id
from eos_connectors.sinks.kafka.marker import MarkerGroup
from eos_connectors.sinks.kafka.options import parse_options as sink_options
from eos_connectors.sinks.kafka.options import transactional_id
from eos_connectors.sinks.kafka.pool import ClientPool, PlainProducers
from tests.sink_util import stream_into

pytestmark = pytest.mark.services

_TASK_IDS = itertools.count(1)


def _task(
    batch: int, run: str = "run-1", partition: int = 0, query: str = "kafka-query"
) -> TaskIdentity:
    return TaskIdentity(query, "kafka", run, batch, partition, next(_TASK_IDS))


def _rows(batch: int) -> list[pa.RecordBatch]:
    values = [f"b{batch}-r{i}".encode() for i in range(50)]
    keys = [f"k{i % 5}".encode() for i in range(50)]
    return [pa.RecordBatch.from_arrays([pa.array(keys), pa.array(values)], ["key", "value"])]


def _paused(batch: pa.RecordBatch, meanwhile: Callable[[], None]) -> Iterator[pa.RecordBatch]:
    """A task's rows that pause it past its marker check, before its first record: the
    first (empty) batch is pulled ahead while the task checks (RowsAhead), and
    ``meanwhile`` runs when the task asks for more."""
    yield batch.slice(0, 0)
    meanwhile()
    yield batch


@pytest.fixture
def writer(endpoints: Endpoints, unique: str) -> KafkaExactlyOnceWriter:
    topic = f"ks-{unique}"
    create_topic(endpoints.kafka, topic, 2)
    options = sink_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "topic": topic,
            "sinkId": f"ks-{unique}",
        }
    )
    check_broker(options)  # what the driver does at query start: creates the marker log
    return KafkaExactlyOnceWriter(options)


def _values(endpoints: Endpoints, writer: KafkaExactlyOnceWriter, isolation: str) -> list[bytes]:
    topic = writer.options.topic
    assert topic is not None
    return sorted(r.value for r in read_to_end(endpoints.kafka, topic, isolation))


def _expected(batches: range) -> list[bytes]:
    return sorted(v for b in batches for v in _rows(b)[0].column("value").to_pylist())


@pytest.mark.parametrize("point", ["before-prepare", "after-prepare", "after-commit"])
def test_a_task_crashed_at_each_point_then_replayed_writes_once(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter, point: str
) -> None:
    writer.write_task(_task(0), iter(_rows(0)))
    with pytest.raises(faults.SimulatedCrash), faults.simulate(f"{point}@1"):
        writer.write_task(_task(1), iter(_rows(1)))
    replay = writer.write_task(_task(1, run="run-2"), iter(_rows(1)))
    assert replay.skipped == (point == "after-commit"), "a committed task must not write again"
    writer.write_task(_task(2, run="run-2"), iter(_rows(2)))
    assert _values(endpoints, writer, "read_committed") == _expected(range(3))
    topic = writer.options.topic
    assert topic is not None
    assert open_transactions(endpoints.kafka_bootstrap, topic) == set(), (
        "a transaction was left open"
    )


def test_a_zombie_attempt_cannot_commit(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter, unique: str
) -> None:
    """Two live producers of one transactional id: the fenced one's records stay invisible."""
    options, out = writer.options, writer.options.topic
    assert out is not None
    name, task = f"zombie-{unique}", _task(7)
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
    log_marker(retry, marker, task)
    records: Iterator[list[Row]] = iter([[(out, b"retry", b"k", None, None, None)]])
    finish(retry, task, records, name, TaskSteps("sink write", 7, rest="produce"))
    assert marker.read() == (8, "kafka-query"), "the marker names the query that wrote it"
    marker.close()
    with pytest.raises(KafkaException, match=r"(?i)fenced|epoch"):
        zombie.commit_transaction(30)
    assert _values(endpoints, writer, "read_committed") == [b"retry"]
    assert _values(endpoints, writer, "read_uncommitted") == [b"retry", b"zombie"]
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
    zombie_task, retry_task = _task(3), _task(3, run="run-2")
    woke: list[str] = []

    def retry() -> None:
        # The retry runs its whole transaction while the zombie is between its marker
        # check and its first record.
        writer.write_task(retry_task, iter(_rows(3)))
        woke.append("zombie")

    report = writer.write_task(zombie_task, _paused(_rows(3)[0], retry))
    assert report.skipped and report.records == 0
    assert woke == ["zombie"]
    assert _values(endpoints, writer, "read_committed") == _expected(range(3, 4))


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
        report = writer.write_task(_task(batch), iter(_rows(batch)), (first, second)[batch % 2])
        assert not report.skipped and report.records == 50
    assert (first.created, second.created) == (3, 3), "each fenced pooled producer replaced"
    assert len(reads) == 6, "each new producer reads the marker stably once"
    # Back to back on one worker, the pooled producer is reused: no new one, and the
    # marker it committed last is known without a stable read.
    writer.write_task(_task(6), iter(_rows(6)), second)
    assert (second.created, len(reads)) == (3, 6)
    # A late replay of a batch the other worker wrote writes nothing: first's producer
    # (last committed batch 4) was fenced since, so what it remembers is not trusted.
    assert writer.write_task(_task(5, run="run-2"), iter(_rows(5)), first).skipped
    assert writer.write_task(_task(4, run="run-2"), iter(_rows(4)), first).skipped
    assert _values(endpoints, writer, "read_committed") == _expected(range(7))
    topic = writer.options.topic
    assert topic is not None
    assert open_transactions(endpoints.kafka_bootstrap, topic) == set()


def _wait_for_metadata_quiet(producer: Any, caplog: Any, answered: str) -> None:
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


def test_a_new_producer_has_looked_the_topic_up_before_its_first_row(
    endpoints: Endpoints, unique: str, caplog: Any
) -> None:
    """A new producer asks for the topic's partitions right after init_transactions(),
    while its task still waits for Spark's rows; otherwise its first rows wait for that
    round trip after they came (librdkafka's metadata log shows which happened)."""
    topic = f"ks-meta-{unique}"
    create_topic(endpoints.kafka, topic, 2)
    options = sink_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "topic": topic,
            "sinkId": f"ks-meta-{unique}",
            "kafka.debug": "metadata",
        }
    )
    check_broker(options)
    writer, pool = KafkaExactlyOnceWriter(options), ClientPool()
    name = transactional_id(options, sink_id(options, _task(0).query_id), 0)
    pooled, marker = pool.take(options, name)
    assert pooled is None
    producer = pool.new_producer(options, name)
    marker.known = marker.read()  # what a task does after its producer's init
    caplog.set_level(logging.DEBUG, logger=LIBRDKAFKA_LOG.name)
    answered = f"Topic {topic} with"
    _wait_for_metadata_quiet(producer, caplog, answered)
    caplog.clear()
    pool.give_back(options, name, producer, marker)  # new, and no transaction yet
    report = writer.write_task(_task(0), iter(_rows(0)), pool)
    assert (report.records, pool.created) == (50, 1)
    lines = [r.getMessage() for r in caplog.records if r.name == LIBRDKAFKA_LOG.name]
    assert any("Request metadata" in line for line in lines), "the log shows metadata requests"
    assert not [line for line in lines if answered in line], lines
    assert _values(endpoints, writer, "read_committed") == _expected(range(1))


def test_a_producer_that_lost_its_broker_is_replaced_and_not_kept(
    endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """A task whose broker is cut off by a real TCP proxy for 4 s (through its proxied
    listener) while it begins its transaction still commits, and the next batch does
    not reuse that producer: librdkafka's send_offsets_to_transaction() may block for
    good after it lost the group coordinator (librdkafka#5456), and then the task fences
    in a new producer after SEND_OFFSETS_LIMIT; a producer that lost a broker and went
    on is not kept either. 5-25 s."""
    import threading

    from eos_connectors.dev.harness.network import NetworkFaults

    if not endpoints.kafka_proxied:
        pytest.skip("this broker has no proxied listener (restart the stack's Kafka)")
    topic = f"ks-lost-{unique}"
    create_topic(endpoints.kafka, topic, 2)
    network, piped = NetworkFaults.start(tmp_path / "toxiproxy", endpoints, ("kafka",))
    try:
        bootstrap = piped.kafka_bootstrap
        options = sink_options(
            {"kafka.bootstrap.servers": bootstrap, "topic": topic, "sinkId": f"lost-{unique}"}
        )
        writer, pool = KafkaExactlyOnceWriter(options), ClientPool()
        for batch in range(2):
            writer.write_task(_task(batch), iter(_rows(batch)), pool)
        assert pool.created == 1, "kept while its brokers stayed"
        cut = threading.Thread(target=network.inject, args=("kafka", "cut"))
        cut.start()
        time.sleep(0.5)
        writer.write_task(_task(2), iter(_rows(2)), pool)  # waits out the cut
        cut.join()
        writer.write_task(_task(3), iter(_rows(3)), pool)
        assert pool.created == 2, "the producer that lost its broker was not kept"
    finally:
        network.stop()
    assert _values(endpoints, writer, "read_committed") == _expected(range(4))


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
        writer.write_rows(iter(_rows(batch)), pool)
    assert pool.created == 1, "one producer for three tasks"
    too_large = pa.RecordBatch.from_arrays(
        [pa.array([b"k"]), pa.array([b"x" * 5000])], ["key", "value"]
    )
    with pytest.raises(KafkaSinkError, match=r"1 failed .*(?i:too large)"):
        writer.write_rows(iter([too_large]), pool)
    writer.write_rows(iter(_rows(3)), pool)
    assert pool.created == 2, "the failed task's producer was dropped, not reused"
    delivered = [r.value for r in read_to_end(endpoints.kafka, topic)]
    assert sorted(delivered) == _expected(range(4))


def _fenced_lines(writer: KafkaExactlyOnceWriter, name: str, caplog: Any) -> list[str]:
    """What librdkafka logs through the sink's logger when a pooled producer of ``name``,
    fenced by a newer one, starts a transaction."""
    caplog.clear()
    old = fenced_producer(writer.options, name)
    newer = fenced_producer(writer.options, name)
    marker = MarkerGroup(writer.options, name)
    with pytest.raises(Exception, match=r"(?i)fenced"):
        begin(old, marker, _task(0))
    with contextlib.suppress(KafkaException):  # poll() raises the fatal error too
        old.poll(1)  # serves the log lines librdkafka queued
    marker.close()
    del old, newer
    return [r.getMessage() for r in caplog.records if r.name == LIBRDKAFKA_LOG.name]


def test_a_fenced_pooled_producers_expected_errors_stay_out_of_the_log(
    writer: KafkaExactlyOnceWriter, unique: str, caplog: Any
) -> None:
    """Spark moves task partitions between workers every batch or so: librdkafka's
    FATAL 'fenced by a newer instance' lines are expected then and are dropped; with
    the filter off the same steps log them (so this test sees them)."""
    caplog.set_level(logging.DEBUG, logger=LIBRDKAFKA_LOG.name)
    (expected,) = LIBRDKAFKA_LOG.filters
    LIBRDKAFKA_LOG.removeFilter(expected)
    try:
        unfiltered = _fenced_lines(writer, f"loud-{unique}", caplog)
    finally:
        LIBRDKAFKA_LOG.addFilter(expected)
    assert any("fenced by a newer instance" in line for line in unfiltered), unfiltered
    filtered = _fenced_lines(writer, f"quiet-{unique}", caplog)
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
    writer.write_task(_task(0), iter(_rows(0)), second)
    writer.write_task(_task(1), iter(_rows(1)), first)  # first now holds the current epoch
    woke: list[str] = []

    def retry() -> None:
        writer.write_task(_task(2, run="run-2"), iter(_rows(2)), second)
        woke.append("zombie")

    zombie = writer.write_task(_task(2), _paused(_rows(2)[0], retry), first)
    assert woke == ["zombie"]
    assert zombie.skipped, "the zombie found its batch marked once it was fenced"
    assert _values(endpoints, writer, "read_committed") == _expected(range(3))
    writer.write_task(_task(3), iter(_rows(3)), first)
    assert _values(endpoints, writer, "read_committed") == _expected(range(4))


def test_a_new_checkpoint_that_reuses_the_sink_id_fails_instead_of_skipping(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter
) -> None:
    """The new query's batch 0 is below the old marker: without the marker's query id it
    would be skipped silently, and every batch after it up to the old query's last."""
    for batch in range(3):
        writer.write_task(_task(batch), iter(_rows(batch)))
    with pytest.raises(SinkClaimedError, match=r"belongs to query kafka-query.*new-query"):
        writer.write_task(_task(0, run="new", query="new-query"), iter(_rows(9)))
    assert _values(endpoints, writer, "read_committed") == _expected(range(3))


def test_of_two_queries_sharing_a_sink_id_only_one_writes(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter
) -> None:
    """Query A's first task claims the sink id and waits for its rows; query B's tasks,
    on A's task partition and on one A never wrote, are refused before they write
    anything; A then commits, and only A's rows are in the topic."""
    first = _task(0, query="query-a")
    refused: list[str] = []

    def query_b() -> None:
        for partition in (0, 3):
            other = _task(0, run="b", partition=partition, query="query-b")
            with pytest.raises(SinkClaimedError, match="belongs to query query-a"):
                writer.write_task(other, iter(_rows(1)))
            refused.append(f"b{partition}")

    report = writer.write_task(first, _paused(_rows(0)[0], query_b))
    assert (report.records, refused) == (50, ["b0", "b3"])
    assert _values(endpoints, writer, "read_committed") == _expected(range(1))


@pytest.mark.parametrize("b_claims", ["before A reads again", "after A read"])
def test_two_queries_claiming_one_sink_id_at_once_leave_one_owner(
    endpoints: Endpoints,
    writer: KafkaExactlyOnceWriter,
    monkeypatch: pytest.MonkeyPatch,
    b_claims: str,
) -> None:
    """The claim is a compare-and-set by fencing. Query A finds no claim and starts to take
    it; query B takes it meanwhile, either before A reads the claim again after its
    init_transactions() (A sees B's claim) or right after A read it as free (B's
    init_transactions() fenced A, whose commit fails; A reads again and sees B's)."""
    from eos_connectors.sinks.kafka import claim

    sid = writer.options.sink_id
    assert sid is not None
    real, calls = claim.read_claim, []

    def racing(options: Any, sink_id: str, consumer: Any) -> tuple[str, bool]:
        calls.append(sink_id)
        if len(calls) != 2:  # A's second read: inside its compare-and-set
            return real(options, sink_id, consumer)
        if b_claims == "before A reads again":
            claim.ensure_claimed(options, sink_id, "query-b")
            return real(options, sink_id, consumer)
        found = real(options, sink_id, consumer)
        claim.ensure_claimed(options, sink_id, "query-b")
        return found

    monkeypatch.setattr(claim, "read_claim", racing)
    with pytest.raises(SinkClaimedError, match="belongs to query query-b"):
        claim.ensure_claimed(writer.options, sid, "query-a")
    monkeypatch.setattr(claim, "read_claim", real)
    claim.ensure_claimed(writer.options, sid, "query-b")  # B holds it, and may write
    with pytest.raises(SinkClaimedError, match="query-b"):
        writer.write_task(_task(0, query="query-a"), iter(_rows(0)))
    assert _values(endpoints, writer, "read_committed") == []


def test_a_marker_whose_group_offsets_expired_is_found_in_the_marker_log(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter
) -> None:
    """Group offsets expire after offsets.retention.minutes once a sink stops writing; a
    replay after that must still find the marker, or it writes the batch again."""
    for batch in range(3):
        writer.write_task(_task(batch), iter(_rows(batch)))
    options = writer.options
    groups = _marker_groups(writer)
    admin = AdminClient(options.client_config())
    for future in admin.delete_consumer_groups(groups, request_timeout=30).values():
        future.result()  # what expiry does
    # on another worker: this one's pooled producer remembers the marker it committed
    replay = writer.write_task(_task(2, run="after-expiry"), iter(_rows(2)), ClientPool())
    assert replay.skipped, "a batch marked before the group expired was written again"
    with pytest.raises(SinkClaimedError, match="kafka-query"):
        writer.write_task(_task(0, run="new", query="new-query"), iter(_rows(9)))
    writer.write_task(_task(3, run="after-expiry"), iter(_rows(3)))
    assert _values(endpoints, writer, "read_committed") == _expected(range(4))
    resource = ConfigResource("TOPIC", options.marker_log)
    config = admin.describe_configs([resource])[resource].result(timeout=30)
    assert config["cleanup.policy"].value == "compact"


def test_a_record_in_the_marker_log_that_is_no_marker_is_never_read_as_one(
    endpoints: Endpoints, unique: str
) -> None:
    """Another writer on the marker log: under the task's own key, a replay whose group
    offsets are gone fails with the record named (rather than taking "nothing done" and
    writing again); under other keys, ``eos sinks list`` skips it."""
    from confluent_kafka import Producer

    from eos_connectors.sinks.kafka.admin import KafkaSinkAdmin

    topic, log_topic = f"ks-{unique}", f"ks-log-{unique}"
    create_topic(endpoints.kafka, topic, 2)
    options = sink_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "topic": topic,
            "sinkId": f"ks-{unique}",
            "markerLogTopic": log_topic,
        }
    )
    check_broker(options)
    writer = KafkaExactlyOnceWriter(options)
    for batch in range(2):
        writer.write_task(_task(batch), iter(_rows(batch)))
    (group,) = _marker_groups(writer)
    stray = Producer(options.client_config())
    stray.produce(log_topic, b'{"unrelated": true}', b"someone-else")
    stray.produce(log_topic, b"not json", group.encode())
    assert stray.flush(30) == 0
    admin = AdminClient(options.client_config())
    for future in admin.delete_consumer_groups([group], request_timeout=30).values():
        future.result()  # what expiry does: the log is all that is left
    with pytest.raises(KafkaSinkError, match=rf"{log_topic}.*{group}.*not a sink marker"):
        writer.write_task(_task(1, run="after-expiry"), iter(_rows(1)), ClientPool())
    assert _values(endpoints, writer, "read_committed") == _expected(range(2))
    listed = KafkaSinkAdmin(options.client_config(), marker_log=log_topic).records()
    (mine,) = [r for r in listed if r.sink_id == f"ks-{unique}"]
    assert mine.last_decided == 1, "the last marker that is one"


def _marker_groups(writer: KafkaExactlyOnceWriter) -> list[str]:
    from eos_connectors.sinks.kafka.options import transactional_id

    sink_id = writer.options.sink_id
    assert sink_id is not None
    return [transactional_id(writer.options, sink_id, 0)]


def test_a_marker_log_without_compaction_is_refused(endpoints: Endpoints, unique: str) -> None:
    topic, log = f"ks-{unique}", f"ks-log-{unique}"
    create_topic(endpoints.kafka, topic, 1)
    create_topic(endpoints.kafka, log, 1, **{"cleanup.policy": "delete"})
    options = sink_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "topic": topic,
            "markerLogTopic": log,
        }
    )
    with pytest.raises(ConfigError, match=rf"'{log}' .*cleanup.policy=delete.*compact"):
        check_broker(options)


def _write(
    spark: SparkSession,
    endpoints: Endpoints,
    source: str,
    tmp_path: Path,
    select: list[str],
    **options: str,
) -> None:
    sink = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, **options}
    stream_into(spark, endpoints, source, tmp_path, select, "eos_kafka", **sink)


def _source(endpoints: Endpoints, unique: str) -> tuple[str, str]:
    source, out = f"ks-in-{unique}", f"ks-out-{unique}"
    create_topic(endpoints.kafka, source, partitions=3)
    create_topic(endpoints.kafka, out, partitions=2)
    produce_words(endpoints.kafka_bootstrap, source, 500, seed=len(unique))
    return source, out


@pytest.mark.spark
def test_the_sink_writes_as_sparks_own_kafka_sink_does(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """A source DataFrame written straight to the sink, as Spark's Kafka sink takes it:
    the ``topic`` option wins over its ``topic`` column (the input topic), a null value
    is a tombstone, a ``timestamp`` column sets each record's timestamp, and keys land on
    the partitions a Java producer's default partitioner puts them on (murmur2), here
    checked against a real Java producer."""
    source, out = _source(endpoints, unique)
    select = [
        "key",
        "CASE WHEN offset % 7 = 3 THEN NULL ELSE value END AS value",
        "topic",
        "timestamp - INTERVAL 1 DAY AS timestamp",
    ]
    _write(spark, endpoints, source, tmp_path, select, topic=out)
    written = read_to_end(endpoints.kafka, out)
    assert len(written) == 500, "every record went to the option's topic"
    assert len(read_to_end(endpoints.kafka, source)) == 500, "none back to the input"
    tombstones = sum(1 for r in written if r.value == b"")
    source_rows = read_to_end(endpoints.kafka, source)
    assert tombstones == sum(1 for r in source_rows if r.offset % 7 == 3) > 0
    day = 86_400_000
    assert sorted(r.timestamp for r in written) == sorted(r.timestamp - day for r in source_rows)
    ours = {r.key: r.partition for r in written}
    assert len({(r.key, r.partition) for r in written}) == len(ours), "a key on two partitions"
    assert ours == _java_partitions(endpoints, sorted(k for k in ours if k), unique)


def _java_partitions(endpoints: Endpoints, keys: list[bytes], unique: str) -> dict[bytes, int]:
    """Where a Java producer with its default partitioner puts ``keys`` on a topic of two
    partitions (the broker's own kafka-clients jar; ``tests/java/JavaKeyedProducer.java``)."""
    import subprocess

    from eos_connectors.dev.stack.kafka import ensure_jars

    topic = f"ks-java-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    program = Path(__file__).resolve().parents[1] / "java" / "JavaKeyedProducer.java"
    command = ["java", "-cp", f"{ensure_jars()}/*", str(program), endpoints.kafka_bootstrap, topic]
    done = subprocess.run(
        command, input=b"\n".join(keys) + b"\n", capture_output=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return {r.key: r.partition for r in read_to_end(endpoints.kafka, topic) if r.key}


@pytest.mark.spark
def test_wrong_types_missing_topic_and_long_timeouts_fail_at_start(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    source, out = _source(endpoints, unique)
    with pytest.raises(Exception, match="Column 'value' must be binary or string"):
        _write(spark, endpoints, source, tmp_path / "a", ["key", "offset AS value"], topic=out)
    with pytest.raises(Exception, match=r"exceeds the broker's transaction\.max\.timeout\.ms"):
        _write(
            spark,
            endpoints,
            source,
            tmp_path / "c",
            ["key", "value"],
            topic=out,
            **{"kafka.transaction.timeout.ms": str(24 * 3600 * 1000)},
        )
    with pytest.raises(Exception, match=f"topic 'absent-{unique}', which does not exist"):
        _write(spark, endpoints, source, tmp_path / "b", ["key", "value"], topic=f"absent-{unique}")


def _late(batches: list[pa.RecordBatch], before: float, between: float = 0.0) -> Iterator[Any]:
    """Rows Spark hands over late: ``before`` seconds before the first batch (upstream work),
    ``between`` seconds after each one."""
    time.sleep(before)
    for batch in batches:
        yield batch
        time.sleep(between)


def _short_timeout_writer(endpoints: Endpoints, unique: str) -> KafkaExactlyOnceWriter:
    topic = f"ks-timeout-{unique}"
    create_topic(endpoints.kafka, topic, 2)
    options = sink_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "topic": topic,
            "sinkId": f"ks-timeout-{unique}",
            "kafka.transaction.timeout.ms": "2000",
        }
    )
    check_broker(options)
    return KafkaExactlyOnceWriter(options)


def test_time_before_the_first_row_does_not_count_against_the_transaction_timeout(
    endpoints: Endpoints, unique: str
) -> None:
    """The transaction begins at the first row: a task whose rows come 4 s late (a slow
    stateful stage upstream) commits under a 2 s transaction.timeout.ms (the broker
    aborts a transaction open past it within a second here)."""
    writer = _short_timeout_writer(endpoints, unique)
    report = writer.write_task(_task(0), _late(_rows(0), before=4.0), ClientPool())
    assert report.records == 50
    assert _values(endpoints, writer, "read_committed") == _expected(range(1))


def test_a_transaction_open_past_its_timeout_says_which_setting_to_raise(
    endpoints: Endpoints, unique: str
) -> None:
    """Rows that keep coming for longer than transaction.timeout.ms: the broker aborts the
    transaction (the producer then reads as fenced); the task's error names the option
    to raise, and nothing of it is visible."""
    writer = _short_timeout_writer(endpoints, unique)
    batches = [_rows(0)[0].slice(0, 25), _rows(0)[0].slice(25)]
    with pytest.raises(KafkaSinkError, match=r"longer than kafka\.transaction\.timeout\.ms \(2000"):
        writer.write_task(_task(0), _late(batches, before=0, between=4.0), ClientPool())
    assert _values(endpoints, writer, "read_committed") == []


def test_a_marker_in_the_log_behind_an_open_transaction_is_still_found(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter
) -> None:
    """Every task's transaction writes the marker log, so another task's open transaction
    holds the log's last stable offset below a marker committed after it began. A task
    whose group offsets expired reads the log through it (waiting for it to end) instead
    of reading up to the last stable offset and missing its marker (then writing its
    batch twice)."""
    from threading import Timer

    pool = ClientPool()
    for batch in range(2):
        writer.write_task(_task(batch, partition=1), iter(_rows(batch)), pool)
    options = writer.options
    blocker = fenced_producer(options, f"blocker-{options.sink_id}")
    blocker.begin_transaction()
    blocker.produce(options.marker_log, b"{}", b"someone-else", partition=0)
    blocker.flush(30)  # open, below the next marker
    writer.write_task(_task(2, partition=1), iter(_rows(2)), pool)  # its marker: behind it
    (group,) = [transactional_id(options, options.sink_id or "", 1)]
    admin = AdminClient(options.client_config())
    for future in admin.delete_consumer_groups([group], request_timeout=30).values():
        future.result()  # what expiry does: the log is all that is left
    Timer(2.0, lambda: blocker.abort_transaction(30)).start()
    replay = writer.write_task(
        _task(2, run="after-expiry", partition=1), iter(_rows(2)), ClientPool()
    )
    assert replay.skipped, "the marker behind the open transaction was missed"
    assert _values(endpoints, writer, "read_committed") == _expected(range(3))
