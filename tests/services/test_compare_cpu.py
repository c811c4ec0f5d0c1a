"""The benchmarks' CPU clocks find the local broker and see what transactions cost it:
`eos bench compare`'s per-pipeline clock and `eos bench kafka-cpu`'s per-task modes.

Second tier (`make full`, ~11 s): run it before a release and whenever the benchmarks'
clocks (connectors/dev/compare) change.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil  # type: ignore[import-untyped]
import pytest
from confluent_kafka import Producer

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.compare import sink_cpu
from eos_connectors.dev.compare.process import THREAD_LIST_EVERY, CpuClock, local_broker
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.kafka.decisions import read_decision
from eos_connectors.sinks.kafka.options import KafkaSinkOptions, parse_options
from eos_connectors.sinks.kafka.pool import ClientPool
from tests.kafka_sink_util import read_written

pytestmark = [pytest.mark.services, pytest.mark.full]


def test_the_clock_charges_the_local_broker_for_transactions(
    endpoints: Endpoints, unique: str
) -> None:
    broker = local_broker(endpoints.kafka_bootstrap)
    assert broker is not None and "kafka.Kafka" in broker.cmdline()
    assert local_broker("192.0.2.1:9092") is None  # not on this machine: not looked for
    topic = f"cpu-{unique}"
    create_topic(endpoints.kafka, topic)
    producer = Producer(
        {"bootstrap.servers": endpoints.kafka_bootstrap, "transactional.id": f"cpu-{unique}"}
    )
    producer.init_transactions(30)
    clock = CpuClock(broker)
    clock.sample([])
    began = time.time()
    for i in range(40):
        producer.begin_transaction()
        producer.produce(topic, str(i).encode())
        producer.commit_transaction(30)
    ended = time.time()
    time.sleep(0.02)
    clock.sample([])
    used = clock.between(began, ended)
    assert used is not None
    assert used["pipeline"] == 0.0  # an empty tree
    assert used["broker"] > 0.01  # ~40 transactions' coordinator work


def test_the_clock_finds_a_real_jvms_gc_and_jit_threads(endpoints: Endpoints) -> None:
    # The broker stands in for a pipeline's JVM: a HotSpot JVM (Java 17) in the tree.
    broker = local_broker(endpoints.kafka_bootstrap)
    assert broker is not None
    clock = CpuClock()
    tree = [psutil.Process(), broker]
    for _ in range(THREAD_LIST_EVERY + 1):
        clock.sample(tree)
        time.sleep(0.01)
    kinds = set(clock._kinds.values())
    assert kinds == {"jvm-gc", "jvm-jit"}, kinds
    last = clock.samples[-1][1]
    assert last["jvm"] > last["jvm-gc"] + last["jvm-jit"] > 0  # a JVM's life so far
    assert last["pipeline"] == last["jvm"] + last["driver"]


@pytest.mark.cost(6)
def test_the_kafka_cpu_bench_measures_each_mode_on_the_real_broker(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    results = sink_cpu.run(endpoints.kafka_bootstrap, tasks=8, rounds=1, out_dir=tmp_path)
    assert [r.mode for r in results] == list(sink_cpu.MODES)
    for r in results:
        assert r.wall_ms > 0 and r.client_cpu_ms > 0 and r.broker_cpu_ms is not None, r
    saved = json.loads((tmp_path / "kafka-cpu.json").read_text())
    assert saved["local_broker"] and [r["mode"] for r in saved["results"]] == list(sink_cpu.MODES)
    lines = sink_cpu.table(results)
    assert lines[2].startswith("| at-least-once |") and "(1.0x)" in lines[2]


def _sink_options(endpoints: Endpoints, unique: str) -> KafkaSinkOptions:
    """A sink on a new 4-partition topic with its own marker log, as the bench makes."""
    topic = f"cpu-{unique}"
    create_topic(endpoints.kafka, topic, 4)
    create_topic(endpoints.kafka, f"{topic}-markers", 1, **{"cleanup.policy": "compact"})
    return parse_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "topic": topic,
            "markerLogTopic": f"{topic}-markers",
        }
    )


@pytest.mark.parametrize(
    ("mode", "new_producers"),
    [("exactly-once, task commit", 1), ("exactly-once, task commit, moved", 9)],
)
def test_a_moved_task_takes_a_new_producer_and_a_staying_one_does_not(
    endpoints: Endpoints,
    unique: str,
    monkeypatch: pytest.MonkeyPatch,
    mode: str,
    new_producers: int,
) -> None:
    made: list[str] = []
    real = ClientPool.new_producer

    def counted(pool: ClientPool, options: KafkaSinkOptions, name: str) -> Producer:
        made.append(name)
        return real(pool, options, name)

    monkeypatch.setattr(ClientPool, "new_producer", counted)
    task = sink_cpu._task(mode, _sink_options(endpoints, unique))
    for b in range(3 + 6):  # warm-up and measured tasks alike
        task(b)
    assert len(made) == new_producers  # moved: every task's pooled producer was fenced


def test_a_call_of_the_four_task_mode_is_one_batch_of_four_tasks_and_its_commit(
    endpoints: Endpoints, unique: str
) -> None:
    options = _sink_options(endpoints, unique)
    topic = options.topic
    assert topic is not None
    assert sink_cpu.tasks_per_call(sink_cpu.BATCH_OF_4) == 4
    assert sink_cpu.measured_tasks(sink_cpu.BATCH_OF_4, 10) == 12  # whole batches
    prepared = sink_cpu._task(sink_cpu.BATCH_OF_4, options)(7)
    assert isinstance(prepared, list)
    assert [(p.batch_id, p.partition, p.state) for p in prepared] == [
        (7, p, "prepared") for p in range(4)
    ]
    decision = read_decision(options, prepared[0].sink_id, 7)
    assert sorted(decision.txns) == [0, 1, 2, 3]  # one decision named all four
    written = read_written(endpoints.kafka, topic)
    assert len(written) == 4 * sink_cpu.ROWS  # each task's rows, committed once
