"""Parity with Spark's JVM ``kafka`` format: the same topics read by both, as a batch and
as a stream, row for row and column for column; the same stream written by both
sinks, partition for partition in offset order.

Each side runs in its own Spark process (``tests/pipelines/kafka_parity.py``), the
JVM one with Spark's connector jars (``spark-sql-kafka-0-10``, resolved from Maven
Central once). Cost: two Spark processes, about a minute.

Second tier (`make full`): run it before a release and whenever the source's or the
Kafka sink's options, columns or partitioning change.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.release_venv import HIGHEST, VENVS, python_of, runs_on

pytestmark = [pytest.mark.services, pytest.mark.spark, pytest.mark.full]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "pipelines" / "kafka_parity.py"


def _fill_read_topic(bootstrap: str, topic: str, unique: str) -> None:
    """Three partitions: committed and aborted transactions, plain records with null keys,
    null values, headers and explicit timestamps."""
    create_topic(plaintext(bootstrap), topic, partitions=3)
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"parity-{unique}"})
    txn.init_transactions(30)
    for n in range(6):
        txn.begin_transaction()
        for i in range(20):
            txn.produce(topic, value=f"t{n}-{i}".encode(), key=f"k{i}".encode(), partition=i % 3)
        if n % 3 == 1:
            txn.abort_transaction(30)
        else:
            txn.commit_transaction(30)
        for i in range(10):
            plain.produce(
                topic,
                value=None if i % 4 == 0 else f"p{n}-{i}".encode(),
                key=None if i % 5 == 0 else f"pk{i}".encode(),
                partition=i % 3,
                timestamp=1_700_000_000_000 + n * 100 + i,
                headers=[("h", f"{n}".encode()), ("empty", b"")] if i % 2 else None,
            )
        plain.flush(30)


def _fill_write_input(bootstrap: str, topic: str) -> None:
    """One partition (one task on each side, so each output partition's order is the
    input's): keyed records, some tombstones, some with headers."""
    create_topic(plaintext(bootstrap), topic, partitions=1)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(300):
        producer.produce(
            topic,
            value=None if i % 11 == 0 else f"w{i}".encode(),
            key=f"key-{i % 37}".encode(),
            headers=[("n", str(i).encode())] if i % 3 == 0 else None,
        )
    producer.flush(30)


def _side(fmt: str, endpoints: Endpoints, topics: dict[str, str], out: Path) -> None:
    # Both sides on the highest release: Spark's connector (4.2.0, the newest on Maven
    # Central) needs 4.2+, and the .venv holds the lowest.
    python = python_of(HIGHEST, ROOT / VENVS)
    argv = [python, str(SCRIPT), "--format", fmt, "--bootstrap", endpoints.kafka_bootstrap]
    argv += ["--read-topic", topics["read"], "--write-input", topics["input"]]
    argv += ["--write-topic", topics[fmt], "--out", str(out)]
    if fmt == "kafka":
        from eos_connectors.dev.compare.jars import spark_kafka_jars

        argv += ["--jars", ",".join(str(jar) for jar in spark_kafka_jars())]
    out.mkdir()
    env = {**os.environ, **runs_on(python)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, env=env)
    assert done.returncode == 0, f"{fmt} side failed:\n{done.stderr[-3000:]}"


def _rows(path: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return sorted(rows, key=lambda r: (r["partition"], r["offset"]))


def _written(bootstrap: str, topic: str) -> dict[int, list[tuple[Any, ...]]]:
    """Each partition's records in offset order: (key, value, headers), read_committed."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"parity-read-{topic}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    found: dict[int, list[tuple[Any, ...]]] = {}
    try:
        for partition in range(3):
            _, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), 30)
            consumer.assign([TopicPartition(topic, partition, 0)])
            records: list[tuple[Any, ...]] = []
            while consumer.position([TopicPartition(topic, partition)])[0].offset < high:
                for message in consumer.consume(500, 1.0):
                    if message.error() is None:
                        records.append((message.key(), message.value(), message.headers()))
            found[partition] = records
    finally:
        consumer.close()
    return found


@pytest.mark.cost(37)
def test_reads_and_writes_match_sparks_jvm_kafka_format(
    endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    bootstrap = endpoints.kafka_bootstrap
    topics = {
        "read": f"parity-read-{unique}",
        "input": f"parity-input-{unique}",
        "kafka": f"parity-out-jvm-{unique}",
        "eos_kafka": f"parity-out-eos-{unique}",
    }
    _fill_read_topic(bootstrap, topics["read"], unique)
    _fill_write_input(bootstrap, topics["input"])
    for fmt in ("kafka", "eos_kafka"):
        create_topic(plaintext(bootstrap), topics[fmt], partitions=3)
        _side(fmt, endpoints, topics, tmp_path / fmt)

    jvm, ours = tmp_path / "kafka", tmp_path / "eos_kafka"
    expected = _rows(jvm / "batch.jsonl")
    assert len(expected) == 4 * 20 + 60, "the JVM side read other than the committed records"
    assert _rows(ours / "batch.jsonl") == expected, "a batch read differs from Spark's"
    assert _rows(jvm / "stream.jsonl") == expected
    assert _rows(ours / "stream.jsonl") == expected, "a stream read differs from Spark's"

    theirs, mine = _written(bootstrap, topics["kafka"]), _written(bootstrap, topics["eos_kafka"])
    assert sum(len(r) for r in theirs.values()) == 300
    assert mine == theirs, "the sinks put records on other partitions, or in another order"
