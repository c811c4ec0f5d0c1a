"""The Kafka sink's batch commit in a Spark query (``commitMode=batch``, issue 53): a
read_committed consumer polling while one task of a batch sleeps sees none of the
batch's records, then all of them within 1 s (in ``commitMode=task`` it saw 498 of the
1,000 for the length of the sleep); a failed batch replayed with another split
and a ``rand()`` column writes each input record once; a change stream whose key
reached two tasks is refused before anything is visible, then written after the fix.

Cost: ~27 s (a 4 s sleep inside a task; five queries)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.kafka.coordinator import TransactionClient
from eos_connectors.sinks.kafka.options import ids_prefix, parse_options
from tests.kafka_sink_util import read_written
from tests.kafka_util import produce_plain
from tests.source_util import stream_of

pytestmark = [pytest.mark.services, pytest.mark.spark]

RECORDS = 1_000
SLEEP = 4.0


class Watcher:
    """A read_committed consumer counting the output's records every 0.1 s."""

    def __init__(self, endpoints: Endpoints, topic: str) -> None:
        self.consumer = Consumer(
            {
                **endpoints.kafka,
                "group.id": f"watch-{topic}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        self.consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
        self.seen: list[tuple[float, int]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        count = 0
        while not self.stop.is_set():
            count += len([m for m in self.consumer.consume(1000, 0.1) if m.error() is None])
            self.seen.append((time.monotonic(), count))

    def __enter__(self) -> Watcher:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(1.5)
        self.stop.set()
        self.thread.join(10)
        self.consumer.close()


def _query(
    df: DataFrame,
    checkpoint: Path,
    endpoints: Endpoints,
    topic: str,
    sink: str,
    **options: str,
) -> None:
    query = (
        df.writeStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
        .option("topic", topic)
        .option("sinkId", sink)
        .option("commitMode", "batch")
        .options(**options)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    if query.exception() is not None:
        raise query.exception()  # type: ignore[misc]


@pytest.mark.cost(12)
def test_nothing_of_a_batch_is_visible_while_a_task_still_runs(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    source, out = f"kbc-in-{unique}", f"kbc-out-{unique}"
    create_topic(endpoints.kafka, source, partitions=2)
    create_topic(endpoints.kafka, out, partitions=2)
    produce_plain(endpoints.kafka_bootstrap, source, [b"%d" % i for i in range(RECORDS)])

    @F.udf("binary")
    def slow_in_partition_1(value: bytes, partition: int) -> bytes:
        if partition == 1 and value == b"1":  # one row of input partition 1's task
            time.sleep(SLEEP)
        return value

    df = stream_of(spark, endpoints, subscribe=source, startingOffsets="earliest")
    rows = df.select(F.col("key"), slow_in_partition_1("value", "partition").alias("value"))
    began = time.monotonic()
    with Watcher(endpoints, out) as watcher:
        _query(rows, tmp_path / "checkpoint", endpoints, out, f"kbc-{unique}")
    assert watcher.seen[-1][1] == RECORDS, watcher.seen[-5:]
    # The batch's last stable offsets move at once; a consumer still fetches the two
    # partitions in two polls, so "at once" is: all of it within 1 s of the first record.
    first_seen = next(t for t, count in watcher.seen if count)
    all_seen = next(t for t, count in watcher.seen if count == RECORDS)
    assert all_seen - first_seen < 1.0, "part of the batch was visible before the rest"
    assert first_seen - began > SLEEP, "visible before the sleeping task finished"


@pytest.mark.cost(5)
def test_a_failed_batch_replayed_in_another_split_with_rand_writes_each_record_once(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """The first run fails in a task after the other task prepared (nothing decided);
    the replay, with ``minPartitions`` retuned, splits the batch in 3 before the sink (a
    round-robin shuffle: the sink's task partitions hold other records than the first
    run's) and adds a rand() column: every input record once."""
    source, out = f"kbr-in-{unique}", f"kbr-out-{unique}"
    create_topic(endpoints.kafka, source, partitions=2)
    create_topic(endpoints.kafka, out, partitions=2)
    produce_plain(endpoints.kafka_bootstrap, source, [b"%d" % i for i in range(RECORDS)])
    checkpoint = tmp_path / "checkpoint"

    @F.udf("binary")
    def fails_in_partition_1(value: bytes, partition: int) -> bytes:
        if partition == 1 and value == b"1":
            raise ValueError("task failure of the first run")
        return value

    first = stream_of(spark, endpoints, subscribe=source, startingOffsets="earliest")
    failing = first.select(F.col("key"), fails_in_partition_1("value", "partition").alias("value"))
    with pytest.raises(Exception, match="task failure of the first run"):
        _query(failing, checkpoint, endpoints, out, f"kbr-{unique}")
    assert read_to_end(endpoints.kafka, out, timeout=10) == [], "a failed batch was visible"

    replay = stream_of(
        spark, endpoints, subscribe=source, startingOffsets="earliest", minPartitions="3"
    )
    noisy = replay.repartition(3).select(
        F.col("key"),
        F.concat(F.col("value"), F.lit(b"|"), F.rand().cast("string").cast("binary")).alias(
            "value"
        ),
    )
    _query(noisy, checkpoint, endpoints, out, f"kbr-{unique}")
    written = Counter(
        (r.value or b"").split(b"|")[0] for r in read_written(endpoints.kafka, out, timeout=10)
    )
    assert written == Counter(b"%d" % i for i in range(RECORDS))


@pytest.mark.cost(10)
def test_a_change_streams_key_in_two_tasks_is_refused_before_anything_is_visible(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """One input partition read in two pieces (``minPartitions=2``): key 1's insert in the
    first task, its delete in the second. Written in that split, a compacted topic could
    keep the insert; the batch is refused naming the key, both tasks and the fix, with
    nothing visible and no transaction left open. With ``repartition("key")`` the same
    recorded batch is written: the delete after the insert."""
    source, out, sink = f"kbk-in-{unique}", f"kbk-out-{unique}", f"kbk-{unique}"
    create_topic(endpoints.kafka, source, partitions=1)
    create_topic(endpoints.kafka, out, partitions=1)
    changes = [b"1:c", *(b"%d:c" % i for i in range(2, 202)), b"1:d"]
    produce_plain(endpoints.kafka_bootstrap, source, changes, partition=0)
    checkpoint = tmp_path / "checkpoint"

    def changes_of(df: DataFrame) -> DataFrame:
        parts = F.split(F.col("value").cast("string"), ":")
        return df.select(parts[0].alias("key"), F.col("value"), parts[1].alias("op"))

    split = stream_of(
        spark, endpoints, subscribe=source, startingOffsets="earliest", minPartitions="2"
    )
    with pytest.raises(Exception, match=r"Key key='1' reached two tasks of batch 0") as refused:
        _query(
            changes_of(split), checkpoint, endpoints, out, sink, deleteColumn="op", deleteValue="d"
        )
    assert "partitions 0 and 1" in str(refused.value)
    assert ".repartition('key')" in str(refused.value)
    assert read_to_end(endpoints.kafka, out, timeout=10) == [], "a refused batch was visible"
    options = parse_options({"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": out})
    client = TransactionClient(options.kafka)
    try:
        assert client.open_transactions(ids_prefix(options, sink)) == []
    finally:
        client.close()

    replay = stream_of(spark, endpoints, subscribe=source, startingOffsets="earliest")
    fixed = changes_of(replay).repartition(2, "key")
    _query(fixed, checkpoint, endpoints, out, sink, deleteColumn="op", deleteValue="d")
    records = read_written(endpoints.kafka, out, timeout=10)  # a tombstone's value reads b""
    assert len(records) == 202, "each change once"
    assert [r.value for r in records if r.key == b"1"] == [b"1:c", b""], "the delete last"
