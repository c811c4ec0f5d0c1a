"""The transactional eos_kafka sink through crashes, zombies and bad input, on the real broker.

Pipeline (its own process): eos_kafka -> transformWithStateInPandas running count
-> eos_kafka sink, writing (word, count) each time a word's count changes. Exactly
once means: under read_committed no (word, count) pair appears twice, and each
word's last count equals the count computed from the input.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from pyspark.sql import SparkSession

from connectors.endpoints import Endpoints
from connectors.harness.data import create_topic, produce_words
from connectors.protocol import TaskIdentity
from sinks.kafka.options import parse_options as sink_options
from sinks.kafka.writer import _fenced_producer, _MarkerGroup, _transaction
from sources.kafka.broker import BrokerView
from sources.kafka.options import parse_options as source_options
from tests.kafka_util import Record, read_plain
from tests.pipeline_util import env, fault_env, kill_when, pipeline_command, progress_after, run
from tests.sink_util import stream_into

pytestmark = [pytest.mark.services, pytest.mark.spark]

RECORDS = 2500


def _ends(endpoints: Endpoints, topic: str, isolation: str) -> dict[int, int]:
    view = BrokerView(
        source_options(
            {
                "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
                "subscribe": topic,
                "kafka.isolation.level": isolation,
            }
        )
    )
    return {p: o for (_, p), o in view.latest(view.partitions()).items()}


def _read(endpoints: Endpoints, topic: str, isolation: str = "read_committed") -> list[Record]:
    ends = _ends(endpoints, topic, isolation)
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": endpoints.kafka_bootstrap, "group.id": "t",
                         "isolation.level": isolation, "enable.auto.commit": False})  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p, o in ends.items() if o])
    records: list[Record] = []
    left = {p for p, o in ends.items() if o}
    while left:
        for m in consumer.consume(1000, 1.0):
            if m.error() is None:
                records.append(
                    Record(m.partition() or 0, m.offset() or 0, m.key(), m.value() or b"")
                )
        left = {tp.partition for tp in consumer.position([TopicPartition(topic, p) for p in left])
                if (tp.offset or 0) < ends[tp.partition]}  # fmt: skip
    consumer.close()
    return records


def _check_output(endpoints: Endpoints, topic: str, expected: Counter[str]) -> None:
    records = _read(endpoints, topic)
    pairs = [(r.key, int(r.value)) for r in records]
    assert len(pairs) == len(set(pairs)), "a (word, count) record was written twice"
    last = {w.decode(): c for w, c in sorted(pairs, key=lambda p: p[1]) if w is not None}
    assert last == dict(expected), "lost updates: final counts differ from the input's"
    # No transaction left hanging: a marker in every partition is readable by
    # read_committed readers, which a pending transaction would hold back.
    markers = Producer({"bootstrap.servers": endpoints.kafka_bootstrap})
    partitions = _ends(endpoints, topic, "read_uncommitted")
    for partition in partitions:
        markers.produce(topic, b"marker", b"marker", partition=partition)
    markers.flush(30)
    ends = _ends(endpoints, topic, "read_uncommitted")
    seen = read_plain(
        endpoints.kafka_bootstrap, topic, {p: (0, o) for p, o in ends.items()}, timeout=60
    )
    assert sum(1 for r in seen if r.value == b"marker") == len(partitions)


def _setup(endpoints: Endpoints, unique: str) -> tuple[str, str, Counter[str]]:
    source, out = f"ks-in-{unique}", f"ks-out-{unique}"
    create_topic(endpoints.kafka_bootstrap, source, partitions=3)
    create_topic(endpoints.kafka_bootstrap, out, partitions=2)
    return source, out, produce_words(endpoints.kafka_bootstrap, source, RECORDS, seed=len(unique))


def _command(source: str, out: str, tmp_path: Path, trigger: str) -> list[str]:
    return pipeline_command(
        "--topic", source, "--checkpoint", str(tmp_path / "checkpoint"), "--sink", "kafka",
        "--out-topic", out, "--state", "processor", "--trigger", trigger,
    )  # fmt: skip


@pytest.mark.parametrize("point", ["after-prepare", "after-commit", "source-read"])
def test_crash_at_each_fault_point_three_times(
    endpoints: Endpoints, unique: str, tmp_path: Path, point: str
) -> None:
    source, out, expected = _setup(endpoints, unique)
    command = _command(source, out, tmp_path, "available-now")
    for crash, batch in enumerate((1, 2, 4)):
        marker = tmp_path / f"fired-{crash}"
        code = run(command, fault_env(point, batch, marker))
        assert marker.exists(), f"fault {point}@{batch} did not fire (exit {code})"
    assert run(command, env()) == 0
    _check_output(endpoints, out, expected)
    # Aborted attempts may be visible to read_uncommitted readers, never to read_committed.
    assert len(_read(endpoints, out, "read_uncommitted")) >= len(_read(endpoints, out))


def test_random_kills_three_times(endpoints: Endpoints, unique: str, tmp_path: Path) -> None:
    source, out, expected = _setup(endpoints, unique)
    checkpoint = tmp_path / "checkpoint"
    rng = random.Random(unique)
    for _ in range(3):
        command = _command(source, out, tmp_path, "continuous")
        kill_when(command, env(), progress_after(checkpoint), rng.uniform(0, 2))
    assert run(_command(source, out, tmp_path, "available-now"), env()) == 0
    _check_output(endpoints, out, expected)


def test_a_zombie_attempt_cannot_commit(endpoints: Endpoints, unique: str) -> None:
    out = f"ks-zombie-{unique}"
    create_topic(endpoints.kafka_bootstrap, out, 1)
    options = sink_options({"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": out})
    name, task = f"zombie-{unique}", TaskIdentity("q", 7, 0, 0)
    zombie = _fenced_producer(options, name)
    zombie.begin_transaction()
    zombie.produce(out, b"zombie", b"k")
    zombie.flush(30)
    # The retry fences the zombie, finds batch 7 unmarked, and commits its own records.
    marker = _MarkerGroup(options, name)
    retry = _fenced_producer(options, name)
    assert marker.batches_done() == 0
    _transaction(retry, marker, task, iter([[(out, b"retry", b"k", None, None)]]), name)
    assert marker.batches_done() == 8
    marker.close()
    with pytest.raises(Exception, match=r"(?i)fenced|epoch"):
        zombie.commit_transaction(30)
    assert [r.value for r in _read(endpoints, out)] == [b"retry"]
    assert sorted(r.value for r in _read(endpoints, out, "read_uncommitted")) == [
        b"retry",
        b"zombie",
    ]
    # A third attempt of the same batch sees the marker and writes nothing.
    third = _MarkerGroup(options, name)
    assert third.batches_done() > task.batch_id
    third.close()


def _write(spark: SparkSession, endpoints: Endpoints, source: str, tmp_path: Path,
           select: list[str], **options: str) -> None:  # fmt: skip
    sink = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, **options}
    stream_into(spark, endpoints, source, tmp_path, select, "eos_kafka", **sink)


def test_null_values_are_refused_and_nothing_is_committed(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    source, out, _ = _setup(endpoints, unique)
    select = ["key", "CASE WHEN offset % 7 = 3 THEN NULL ELSE value END AS value"]
    with pytest.raises(Exception, match="has a null value"):
        _write(spark, endpoints, source, tmp_path, select, topic=out)
    assert _read(endpoints, out) == []


def test_wrong_types_missing_topic_and_long_timeouts_fail_at_start(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    source, out, _ = _setup(endpoints, unique)
    with pytest.raises(Exception, match="Column 'value' must be binary or string"):
        _write(spark, endpoints, source, tmp_path / "a", ["key", "offset AS value"], topic=out)
    with pytest.raises(Exception, match=r"exceeds the broker's transaction\.max\.timeout\.ms"):
        _write(spark, endpoints, source, tmp_path / "c", ["key", "value"], topic=out,
               **{"kafka.transaction.timeout.ms": str(24 * 3600 * 1000)})  # fmt: skip
    with pytest.raises(Exception, match=f"topic 'absent-{unique}', which does not exist"):
        _write(spark, endpoints, source, tmp_path / "b", ["key", "value"], topic=f"absent-{unique}")
