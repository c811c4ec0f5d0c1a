"""A stack with a replicated Kafka (`eos stack up --kafka-brokers 3`: three KRaft brokers,
replication 3, min.insync.replicas 2, beside its own PostgreSQL and Redis), with one broker
SIGKILLed at a time and started again while queries run:

- an eos_kafka -> eos_kafka query while the leader of an input partition, the
  transaction coordinator of a sink task partition's transactional id and the leader of
  an output partition are killed in turn: no task may fail (the source asks a moving
  leader again, the sink replaces a producer the coordinator's failover fenced), and the
  output holds each input record exactly once;
- the running-count conformance cell into Kafka, PostgreSQL and Redis (`eos verify
  --kill-broker ... --step-fault ... --network-fault ... --checkpoint-root hdfs://...`),
  every fault point crossed, its checkpoints on HDFS, with a leader killed at a random
  moment, the sink's coordinator killed between a task's produce and its commit,
  every broker's connections reset (through its proxied listener), PostgreSQL's reset
  and Redis cut off: no query may fail on a broker's
  kill, and every sink ends exact (make soak adds PostgreSQL and Redis restarted
  between a decision and its commits).

Cost: ~15 s to start the stack; ~60 s for the first query (each hard kill stalls the
batch in flight until the controller fences the dead broker, ~9 s by default), in
`make soak`; ~165 s for the cell, in CI (which also stands for test_network_faults)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.stack import Stack
from eos_connectors.dev.stack.kafka_cluster import KafkaCluster, java_hash
from eos_connectors.sources.kafka.broker import BrokerView
from eos_connectors.sources.kafka.options import parse_options
from tests.pipeline_util import ROOT, committed_batches, env, kill_group

pytestmark = [pytest.mark.services, pytest.mark.spark]

RECORDS = 4000
PER_BATCH = 100


def _eos(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``eos`` on the stack under ``root``, with no endpoints from the session's stack (its
    HDFS's WebHDFS stays: the sinks record themselves in checkpoints there)."""
    environment = {
        k: v for k, v in env().items() if not k.startswith("EOS_") or k == "EOS_WEBHDFS_URL"
    }
    environment["EOS_STACK_DIR"] = str(root)
    command = [sys.executable, "-m", "eos_connectors.cli", *args]
    return subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The root of a stack whose Kafka is three brokers (PostgreSQL's OS user must reach
    it when the tests run as root, as in test_stack)."""
    base = Path("/var/lib/eos-connectors") if os.geteuid() == 0 else tmp_path_factory.mktemp("r")
    root = base / f"test-replicated-{os.getpid()}"
    try:
        up = _eos(root, "stack", "up", "--kafka-brokers", "3")
        assert up.returncode == 0, up.stderr
        switch = _eos(root, "stack", "up", "--kafka-brokers", "1")
        assert switch.returncode != 0 and "stop it first" in switch.stderr
        status = _eos(root, "stack", "status").stdout
        assert [line.split()[0] for line in status.splitlines()][:3] == [
            "kafka-1",
            "kafka-2",
            "kafka-3",
        ]
        yield root
    finally:
        down = _eos(root, "stack", "down")
        shutil.rmtree(root, ignore_errors=True)
    assert down.returncode == 0 and "kafka-3" in down.stdout, down.stdout + down.stderr


@pytest.fixture(scope="module")
def cluster(replicated: Path) -> KafkaCluster:
    made = Stack(replicated).cluster
    assert made is not None
    return made


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


@pytest.mark.soak  # ~60 s: `make soak`; CI runs the cell below on the same stack
def test_one_broker_killed_at_a_time_never_fails_the_query(
    cluster: KafkaCluster, tmp_path: Path, unique: str
) -> None:
    bootstrap = cluster.bootstrap
    source, out, sink = f"in-{unique}", f"out-{unique}", f"rep{unique}"
    create_topic(plaintext(bootstrap), source, 2)
    create_topic(plaintext(bootstrap), out, 2)
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
    values = [r.value for r in read_to_end(plaintext(bootstrap), out)]
    assert len(values) == RECORDS and set(values) == {str(i).encode() for i in range(RECORDS)}


def test_the_source_asks_again_when_the_broker_named_controller_dies(
    cluster: KafkaCluster, unique: str
) -> None:
    """The source's driver describes topics every batch, an admin request librdkafka sends to
    the broker its metadata names controller. Killed, that broker times the request out
    while the others answer: the driver asks again with fresh metadata, within
    ``kafkaConsumer.pollTimeoutMs``, instead of failing the query (a CI run failed the
    replicated cell's queries so when the killed coordinator was that broker). ~15 s."""
    topic = f"ctl-{unique}"
    create_topic(plaintext(cluster.bootstrap), topic, 2)
    options = {"kafka.bootstrap.servers": cluster.bootstrap, "subscribe": topic}
    view = BrokerView(parse_options({**options, "kafkaConsumer.pollTimeoutMs": "24000"}))
    ids = view.topic_ids([topic])
    controller = view.admin.list_topics(timeout=10).controller_id
    assert ids and controller in cluster.node_ids()
    cluster.kill(controller)
    try:
        began = time.monotonic()
        assert view.topic_ids([topic]) == ids
        assert view.latest([(topic, 0), (topic, 1)]) == {(topic, 0): 0, (topic, 1): 0}
        assert time.monotonic() - began < 24
    finally:
        cluster.start(controller)


@pytest.mark.hdfs
def test_a_conformance_cell_on_a_replicated_kafka_with_brokers_killed(
    replicated: Path, tmp_path: Path, hdfs_url: str
) -> None:
    """The running-count cell into every sink, its checkpoints on HDFS, with the input's
    leader killed at a random moment, the sink's coordinator killed between a task's
    produce and its commit, and a network fault per store (make soak: every broker role
    at random moments, and PostgreSQL and Redis restarted between a decision and its
    commits: ``--step-fault postgres --step-fault redis``)."""
    work = tmp_path / "verify"
    args = ["verify", "--cells", "running-count", "--sinks", "kafka,postgres,redis"]
    args += ["--kills", "0", "--kill-broker", "input-leader"]
    # one network fault per service in the same run (test_network_faults.py: every kind)
    args += ["--network-fault", "postgres:reset", "--network-fault", "redis:cut"]
    args += ["--network-fault", "kafka:reset"]  # every broker's connections: source and sink
    args += ["--step-fault", "coordinator"]
    args += ["--checkpoint-root", f"{hdfs_url}/verify"]
    done = _eos(replicated, *args, "--records", "6000", "--work-dir", str(work))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads((work / "report.json").read_text())
    assert report["plan"]["checkpoints"].startswith(hdfs_url), report["plan"]["checkpoints"]
    killed = " ".join(r["service_crashed"] or "" for r in report["runs"])
    assert "(input-leader)" in killed, report["runs"]
    assert "postgres network reset" in killed and "redis network cut" in killed
    assert "kafka network reset" in killed, killed
    assert "(coordinator at after-prepare)" in killed, killed
    sinks = {
        s["sink"]: (s["lost"], s["duplicated"], s["wrong"], len(s["leftovers"]))
        for s in report["sinks"]
    }
    exact = (0, 0, 0, 0)
    assert sinks == {"rc-kafka": exact, "rc-postgres": exact, "rc-redis-increment": exact}
