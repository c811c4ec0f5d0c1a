"""eos_kafka when records it needs are gone: retention, a recreated, truncated or deleted
topic, with failOnDataLoss true and false.

Cost: ~15 s in the session's Spark."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sources.kafka.offsets import SourceOffset
from tests.kafka_util import (
    delete_records_before,
    produce_plain,
    recreate_topic,
)
from tests.source_util import (
    forget_topic_ids,
    latest_after,
    run_available_now,
    run_from_checkpoint,
    stream_of,
)

pytestmark = [pytest.mark.services, pytest.mark.spark]


def test_fail_on_data_loss(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic = f"src-loss-{unique}"
    create_topic(endpoints.kafka, topic)
    produce_plain(endpoints.kafka_bootstrap, topic, [f"v{i}".encode() for i in range(10)])
    delete_records_before(endpoints.kafka_bootstrap, topic, 0, 4)
    start = json.dumps({topic: {"0": 0}})
    with pytest.raises(Exception, match=rf"{topic}-0: offsets 0\.\.3 were deleted"):
        run_available_now(
            stream_of(spark, endpoints, subscribe=topic, startingOffsets=start), tmp_path / "strict"
        )
    rows, _ = run_available_now(
        stream_of(spark, endpoints, subscribe=topic, startingOffsets=start, failOnDataLoss="false"),
        tmp_path / "lenient",
    )
    assert sorted(r["offset"] for r in rows) == list(range(4, 10))


@pytest.mark.parametrize(
    ("records_after", "keep_ids", "found_by"),
    [
        (3, False, "now ends at offset 3, below the offset 6"),
        (9, True, "was deleted and recreated"),
    ],
    ids=["no-ids-offsets-go-back", "new-id-more-records"],
)
def test_a_recreated_topic_is_data_loss(
    spark: SparkSession,
    endpoints: Endpoints,
    unique: str,
    tmp_path: Path,
    records_after: int,
    keep_ids: bool,
    found_by: str,
) -> None:
    """A checkpoint's offsets of a deleted topic never silently apply to its successor.

    The topic id tells the two topics apart, even when the new one has grown past
    the old offsets; a checkpoint without ids (written by an older version, or a
    broker without them) still sees offsets that go back.
    """
    bootstrap, topic, checkpoint = endpoints.kafka_bootstrap, f"src-recreated-{unique}", tmp_path
    create_topic(plaintext(bootstrap), topic)
    produce_plain(bootstrap, topic, [f"old-{i}".encode() for i in range(6)])
    first = stream_of(spark, endpoints, subscribe=topic, startingOffsets="earliest")
    rows = run_from_checkpoint(first, checkpoint)
    assert len(rows) == 6
    if not keep_ids:
        forget_topic_ids(checkpoint)
    recreate_topic(bootstrap, topic)
    new = [f"new-{i}".encode() for i in range(records_after)]
    produce_plain(bootstrap, topic, new)
    with pytest.raises(Exception, match=found_by) as failure:
        run_from_checkpoint(stream_of(spark, endpoints, subscribe=topic), checkpoint)
    assert "failOnDataLoss=false" in str(failure.value)
    lenient = stream_of(spark, endpoints, subscribe=topic, failOnDataLoss="false")
    rows = run_from_checkpoint(lenient, checkpoint)
    assert sorted(bytes(r["value"]) for r in rows) == sorted(new)


def test_a_log_truncated_under_the_same_topic_id_goes_on_from_its_new_end(
    endpoints: Endpoints, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The checkpoint read a partition to offset 10, and the log (same topic id) now ends
    at 8, as after an unclean leader election: failOnDataLoss=true fails naming it;
    false warns and goes on from 8, as Spark's source does, instead of reading the
    records below 8, which the query read already, a second time."""
    from eos_connectors.sources.kafka.broker import BrokerView
    from eos_connectors.sources.kafka.options import parse_options

    bootstrap, topic = endpoints.kafka_bootstrap, f"src-truncated-{unique}"
    create_topic(plaintext(bootstrap), topic)
    produce_plain(bootstrap, topic, [f"r{i}".encode() for i in range(8)], 0)
    view = BrokerView(parse_options({"kafka.bootstrap.servers": bootstrap, "subscribe": topic}))
    previous = SourceOffset({(topic, 0): 10}, view.topic_ids([topic]))
    with pytest.raises(Exception, match=rf"{topic}-0 now ends at offset 8, below the offset 10"):
        latest_after(endpoints, previous, subscribe=topic)
    planned = latest_after(endpoints, previous, subscribe=topic, failOnDataLoss="false")
    assert planned.starts == {(topic, 0): 8}, "read again from the log start"
    assert "offsets 8..9 of the log the query read are gone" in caplog.text


def test_a_deleted_topic_is_a_data_loss_not_a_silent_stop(
    endpoints: Endpoints, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A subscribed topic deleted under a running query: failOnDataLoss=true fails naming
    the topic and where the query stood; false warns, keeps that position, reads on."""
    from confluent_kafka.admin import AdminClient

    bootstrap, kept, deleted = endpoints.kafka_bootstrap, f"src-kept-{unique}", f"src-del-{unique}"
    for topic in (kept, deleted):
        create_topic(plaintext(bootstrap), topic)
        produce_plain(bootstrap, topic, [b"a", b"b"], 0)
    previous = SourceOffset({(kept, 0): 2, (deleted, 0): 1})
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([deleted])[deleted].result(timeout=30)
    produce_plain(bootstrap, kept, [b"c"], 0)
    subscribe = f"{kept},{deleted}"
    deadline = time.monotonic() + 30
    while True:  # until the brokers no longer describe the deleted topic
        try:
            latest_after(endpoints, previous, subscribe=subscribe)
        except Exception as exc:
            assert f"{deleted}-0 from offset 1 on can no longer be read" in str(exc)
            break
        assert time.monotonic() < deadline, "the deleted topic was never reported"
        time.sleep(0.5)
    planned = latest_after(endpoints, previous, subscribe=subscribe, failOnDataLoss="false")
    assert planned.ends == {(kept, 0): 3, (deleted, 0): 1}, "position kept, the rest read on"
    assert f"topic(s) {deleted} no longer exist" in caplog.text
