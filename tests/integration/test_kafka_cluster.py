"""A replicated Kafka (three KRaft brokers, replication 3, min.insync.replicas 2) with one
broker SIGKILLed at a time and started again while an eos_kafka -> eos_kafka query runs:
the leader of an input partition, the transaction coordinator of a sink task
partition's transactional id, the leader of an output partition. The query must go on
(no task fails: the source asks a moving leader again, the sink replaces a producer the
coordinator's failover fenced) and the output must hold each input record exactly once.

Cost: ~10 s to start the brokers, ~60-80 s for the query (each hard kill stalls the
batch in flight until the controller fences the dead broker, ~9 s by default)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.stack.kafka_cluster import KafkaCluster, java_hash
from tests.pipeline_util import ROOT, committed_batches, env, kill_group

pytestmark = [pytest.mark.services, pytest.mark.spark]

RECORDS = 6000
PER_BATCH = 100


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    made = KafkaCluster(tmp_path_factory.mktemp("replicated"), nodes=3)
    try:
        made.up()
        yield made
    finally:
        made.down()


def test_kafkas_rule_for_a_transactional_ids_coordinator() -> None:
    """Java's String.hashCode, made non-negative as Kafka's Utils.abs does."""
    assert java_hash("hello") == 99162322
    assert java_hash("polygenelubricants") == 0  # hashCode is Integer.MIN_VALUE
    assert java_hash("eos-sink-0") == 1803411642  # as java.lang.String says


def _produce(bootstrap: str, topic: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(RECORDS):
        producer.produce(topic, key=str(i % 97).encode(), value=str(i).encode())
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0


def test_one_broker_killed_at_a_time_never_fails_the_query(
    cluster: KafkaCluster, tmp_path: Path, unique: str
) -> None:
    bootstrap = cluster.bootstrap
    source, out, sink = f"in-{unique}", f"out-{unique}", f"rep{unique}"
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, out, 2)
    _produce(bootstrap, source)
    checkpoint = tmp_path / "checkpoint"
    log_path = tmp_path / "query.log"
    command = [sys.executable, "-m", "tests.pipelines.source_to_kafka"]
    command += ["--bootstrap", bootstrap, "--topic", source, "--out-topic", out]
    command += ["--checkpoint", str(checkpoint), "--sink-id", sink]
    command += ["--max-offsets", str(PER_BATCH), "--cores", "2"]
    victims: dict[str, Callable[[], int]] = {
        "input leader": lambda: cluster.leader(source, 0),
        "sink coordinator": lambda: cluster.coordinator(f"eos-{sink}-0"),
        "output leader": lambda: cluster.leader(out, 1),
    }
    killed = []
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while committed_batches(checkpoint) < 2:
                assert proc.poll() is None, log_path.read_text()[-3000:]
                time.sleep(0.2)
            for what, find in victims.items():
                node = find()
                cluster.kill(node)
                killed.append((what, node, committed_batches(checkpoint)))
                time.sleep(4)
                cluster.start(node)
            code = proc.wait(timeout=600)
        finally:
            kill_group(proc)
    text = log_path.read_text(errors="replace")
    failed_tasks = [line for line in text.splitlines() if "Lost task" in line]
    assert code == 0, f"the query failed after killing {killed}:\n{text[-4000:]}"
    assert not failed_tasks, f"tasks failed after killing {killed}: {failed_tasks[:3]}"
    assert committed_batches(checkpoint) >= RECORDS // PER_BATCH
    values = [r.value for r in read_to_end(bootstrap, out)]
    assert len(values) == RECORDS and set(values) == {str(i).encode() for i in range(RECORDS)}
