"""Who owns a Kafka sink id, and where its markers live: a second query or checkpoint on the
same sink id writes nothing, two claims at once leave one owner, a marker is found in the
marker log after its group offsets expired or behind an open transaction, and a log that
is no marker log is refused, and a topic deleted under a running sink is named.

Cost: ~32 s."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]
from pyspark.sql.types import BinaryType, StructField, StructType

from eos_connectors.core.errors import ConfigError
from eos_connectors.core.protocol import SinkClaimedError
from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.kafka.checks import check_broker
from eos_connectors.sinks.kafka.clients import fenced_producer
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.exactly_once import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.options import parse_options as sink_options
from eos_connectors.sinks.kafka.options import transactional_id
from eos_connectors.sinks.kafka.pool import ClientPool
from tests.kafka_sink_util import (
    a_task,
    claim_owner,
    expected_values,
    marker_groups,
    new_sink_options,
    paused,
    rows_of,
    values_read,
)

pytestmark = pytest.mark.services


def test_a_new_checkpoint_that_reuses_the_sink_id_fails_instead_of_skipping(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter
) -> None:
    """The new query's batch 0 is below the old marker: without the marker's query id it
    would be skipped silently, and every batch after it up to the old query's last."""
    for batch in range(3):
        writer.write_task(a_task(batch), iter(rows_of(batch)))
    with pytest.raises(SinkClaimedError, match=r"belongs to query kafka-query.*new-query"):
        writer.write_task(a_task(0, run="new", query="new-query"), iter(rows_of(9)))
    assert values_read(endpoints, writer, "read_committed") == expected_values(range(3))


def test_of_two_queries_sharing_a_sink_id_only_one_writes(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter
) -> None:
    """Query A's first task claims the sink id and waits for its rows; query B's tasks,
    on A's task partition and on one A never wrote, are refused before they write
    anything; A then commits, and only A's rows are in the topic."""
    first = a_task(0, query="query-a")
    refused: list[str] = []

    def query_b() -> None:
        for partition in (0, 3):
            other = a_task(0, run="b", partition=partition, query="query-b")
            with pytest.raises(SinkClaimedError, match="belongs to query query-a"):
                writer.write_task(other, iter(rows_of(1)))
            refused.append(f"b{partition}")

    report = writer.write_task(first, paused(rows_of(0)[0], query_b))
    assert (report.records, refused) == (50, ["b0", "b3"])
    assert values_read(endpoints, writer, "read_committed") == expected_values(range(1))


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
        writer.write_task(a_task(0, query="query-a"), iter(rows_of(0)))
    assert values_read(endpoints, writer, "read_committed") == []


def test_the_first_tasks_of_one_query_claiming_at_once_all_go_on(
    writer: KafkaExactlyOnceWriter,
) -> None:
    """A query's first batch: every task finds the sink unclaimed and takes the claim at
    the same moment, each fencing the others' init_transactions(). They must not fence
    each other until their attempts run out (a replicated-cluster run lost its first
    task so: "fenced by a newer instance"). Four claimers, five sink ids; without the
    random back-off, 3 claimers failed in 4 of 10 rounds. ~4 s."""
    from eos_connectors.sinks.kafka import claim

    sid = writer.options.sink_id
    assert sid is not None

    def take(sink_id: str, start: threading.Barrier) -> None:
        start.wait()
        claim.ensure_claimed(writer.options, sink_id, "kafka-query")

    for round_ in range(5):
        sink_id, start = f"{sid}-r{round_}", threading.Barrier(4)
        with ThreadPoolExecutor(4) as pool:
            for done in [pool.submit(take, sink_id, start) for _ in range(4)]:
                done.result()
        with pytest.raises(SinkClaimedError, match="belongs to query kafka-query"):
            claim.ensure_claimed(writer.options, sink_id, "another-query")


def test_a_claim_whose_marker_log_is_gone_names_it(endpoints: Endpoints, unique: str) -> None:
    """A marker log deleted after the query's start check made it (or never made, the
    check skipped): the claim's record is never delivered, and librdkafka's commit says
    only "1 message(s) failed delivery". The error names the topic, the option and why.
    ~4 s: the record times out after kafka.transaction.timeout.ms."""
    from eos_connectors.sinks.kafka import claim

    create_topic(endpoints.kafka, f"gone-{unique}", 2)
    options = sink_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "topic": f"gone-{unique}",
            "markerLogTopic": f"gone-log-{unique}",
            "kafka.transaction.timeout.ms": "3000",
        }
    )
    with pytest.raises(claim.ClaimError) as failed:
        claim.ensure_claimed(options, f"gone-{unique}", "kafka-query")
    said = str(failed.value)
    assert f"marker log 'gone-log-{unique}' (option markerLogTopic) was not delivered" in said
    assert "Message timed out" in said and "Nothing was written" in said


@pytest.mark.cost(7)
def test_a_topic_deleted_under_a_running_sink_is_named_as_gone(
    endpoints: Endpoints, unique: str
) -> None:
    """The sink's topic deleted between two batches (an operator's mistake): the next
    task's topic look-up finds it gone and says so, with what to do, in ~5 s; its rows
    waited ~60 s for the broker's refusal before, which said only "Unknown topic or
    partition". (A task that claims the sink again, its markers gone with the topic's
    offsets, names the topic the same way when the claim fails.)"""
    from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter

    options = new_sink_options(endpoints, "ks-gone", unique)
    writer = BatchCommitWriter(options)
    writer.commit([writer.write_task(a_task(0), iter(rows_of(0)))], 0)
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    admin.delete_topics([str(options.topic)])[str(options.topic)].result(30)
    began = time.monotonic()
    with pytest.raises(KafkaSinkError, match=rf"topic 'ks-gone-{unique}' \(option topic\) no "):
        writer.write_task(a_task(1), iter(rows_of(1)))
    assert time.monotonic() - began < 20


def test_a_streams_driver_claims_the_sink_at_start_for_its_checkpoints_query(
    endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """A stream's driver (Spark's call of the format's ``streamWriter``) takes the claim
    for the query id in its checkpoint's metadata, before any task: the first batch's
    tasks then find it theirs at their first look instead of all taking it at once. A
    second checkpoint on the sink id is refused at its start; a checkpoint the driver
    cannot read (none given) leaves the claim to the tasks. ~2 s."""
    from eos_connectors.formats import KafkaDataSource

    options = new_sink_options(endpoints, "kd", unique)
    raw = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": options.topic or ""}
    schema = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])

    def start(query: str | None, sink_id: str) -> None:
        given = {**raw, "sinkId": sink_id}
        if query is not None:
            (tmp_path / query).mkdir()
            (tmp_path / query / "metadata").write_text(json.dumps({"id": query}))
            given["checkpointLocation"] = str(tmp_path / query)
        KafkaDataSource(given).streamWriter(schema, False)

    sid = options.sink_id or ""
    start("query-a", sid)
    assert claim_owner(options, sid) == "query-a"
    writer = KafkaExactlyOnceWriter(options)
    writer.write_task(a_task(0, query="query-a"), iter(rows_of(0)))  # its own: it writes
    with pytest.raises(SinkClaimedError, match=r"belongs to query query-a.*query-b"):
        start("query-b", sid)
    start(None, f"{sid}-unread")
    assert claim_owner(options, f"{sid}-unread") == ""
    assert values_read(endpoints, writer, "read_committed") == expected_values(range(1))


def test_a_marker_whose_group_offsets_expired_is_found_in_the_marker_log(
    endpoints: Endpoints, writer: KafkaExactlyOnceWriter
) -> None:
    """Group offsets expire after offsets.retention.minutes once a sink stops writing; a
    replay after that must still find the marker, or it writes the batch again."""
    for batch in range(3):
        writer.write_task(a_task(batch), iter(rows_of(batch)))
    options = writer.options
    groups = marker_groups(writer)
    admin = AdminClient(options.client_config())
    for future in admin.delete_consumer_groups(groups, request_timeout=30).values():
        future.result()  # what expiry does
    # on another worker: this one's pooled producer remembers the marker it committed
    replay = writer.write_task(a_task(2, run="after-expiry"), iter(rows_of(2)), ClientPool())
    assert replay.skipped, "a batch marked before the group expired was written again"
    with pytest.raises(SinkClaimedError, match="kafka-query"):
        writer.write_task(a_task(0, run="new", query="new-query"), iter(rows_of(9)))
    writer.write_task(a_task(3, run="after-expiry"), iter(rows_of(3)))
    assert values_read(endpoints, writer, "read_committed") == expected_values(range(4))
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
        writer.write_task(a_task(batch), iter(rows_of(batch)))
    (group,) = marker_groups(writer)
    stray = Producer(options.client_config())
    stray.produce(log_topic, b'{"unrelated": true}', b"someone-else")
    stray.produce(log_topic, b"not json", group.encode())
    assert stray.flush(30) == 0
    admin = AdminClient(options.client_config())
    for future in admin.delete_consumer_groups([group], request_timeout=30).values():
        future.result()  # what expiry does: the log is all that is left
    with pytest.raises(KafkaSinkError, match=rf"{log_topic}.*{group}.*not a sink marker"):
        writer.write_task(a_task(1, run="after-expiry"), iter(rows_of(1)), ClientPool())
    assert values_read(endpoints, writer, "read_committed") == expected_values(range(2))
    listed = KafkaSinkAdmin(options.client_config(), marker_log=log_topic).records()
    (mine,) = [r for r in listed if r.sink_id == f"ks-{unique}"]
    assert mine.last_decided == 1, "the last marker that is one"


@pytest.mark.parametrize("policy", ["delete", "compact,delete"])
def test_a_marker_log_that_retention_may_delete_is_refused(
    endpoints: Endpoints, unique: str, policy: str
) -> None:
    """compact,delete was taken for compaction: retention then deletes old segments,
    markers in them too, and a replayed batch would be written twice."""
    topic, log = f"ks-{unique}", f"ks-log-{unique}"
    create_topic(endpoints.kafka, topic, 1)
    create_topic(endpoints.kafka, log, 1, **{"cleanup.policy": policy})
    options = sink_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "topic": topic,
            "markerLogTopic": log,
        }
    )
    with pytest.raises(ConfigError, match=rf"'{log}' .*cleanup.policy={policy}.*compact"):
        check_broker(options)


def test_a_sinks_claim_is_not_read_from_a_sink_whose_id_starts_with_its_own(
    endpoints: Endpoints, unique: str
) -> None:
    """Sink ``a`` and sink ``a-b`` share the marker log: a's first claim, with no claim
    group yet, looks the claim up in the log, where b's markers (keys ``eos-a-b-<n>``)
    used to count as a's: a new query on ``a`` was refused as if ``a-b``'s owned it."""
    topic = f"ks-prefix-{unique}"
    create_topic(endpoints.kafka, topic, 1)
    base = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": topic}
    short, longer = f"p{unique}", f"p{unique}-b"
    check_broker(sink_options({**base, "sinkId": longer}))
    KafkaExactlyOnceWriter(sink_options({**base, "sinkId": longer})).write_task(
        a_task(0, query="query-b"), iter(rows_of(0)), ClientPool()
    )
    options = sink_options({**base, "sinkId": short})
    report = KafkaExactlyOnceWriter(options).write_task(
        a_task(0, query="query-a"), iter(rows_of(0)), ClientPool()
    )
    assert (report.skipped, report.records) == (False, 50), report


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
        writer.write_task(a_task(batch, partition=1), iter(rows_of(batch)), pool)
    options = writer.options
    blocker = fenced_producer(options, f"blocker-{options.sink_id}")
    blocker.begin_transaction()
    blocker.produce(options.marker_log, b"{}", b"someone-else", partition=0)
    blocker.flush(30)  # open, below the next marker
    writer.write_task(a_task(2, partition=1), iter(rows_of(2)), pool)  # its marker: behind it
    (group,) = [transactional_id(options, options.sink_id or "", 1)]
    admin = AdminClient(options.client_config())
    for future in admin.delete_consumer_groups([group], request_timeout=30).values():
        future.result()  # what expiry does: the log is all that is left
    Timer(2.0, lambda: blocker.abort_transaction(30)).start()
    replay = writer.write_task(
        a_task(2, run="after-expiry", partition=1), iter(rows_of(2)), ClientPool()
    )
    assert replay.skipped, "the marker behind the open transaction was missed"
    assert values_read(endpoints, writer, "read_committed") == expected_values(range(3))
