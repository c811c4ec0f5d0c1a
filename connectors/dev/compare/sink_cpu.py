"""``eos bench kafka-cpu``: what one Kafka sink task costs the machine, client and broker.

An exactly-once task of the Kafka sink runs a transaction, and on a machine that also
runs the broker (the local stack, ``make bench``) the broker's work for it takes the
same cores as Spark. This measures a task without Spark, on the real broker: the CPU
time of this process (the task's Python and librdkafka's threads, between tasks
included) and of the local broker (its idle rate, measured first, taken off), per
task of ``ROWS`` rows into a 4-partition topic, in five modes:

* ``at-least-once``: the worker's idempotent producer, then a flush;
* ``exactly-once, batch commit`` (the default ``commitMode``): the task's new
  transactional producer, its checks, rows and marker offset, left open, then the
  driver's commit of a batch of that one task (the decision, ``EndTxn``, the sweep),
  all in this process: a task's cost with its whole share of the commit;
* ``exactly-once, batch commit, 4 tasks a batch``: the same, the driver's commit
  ending four tasks' transactions (task partitions 0-3) as in a query whose batches
  have four sink tasks (the benchmark's pipeline): a task's cost with a quarter of
  the commit;
* ``exactly-once, task commit``: the transactional producer of the task partition's
  last batch, pooled in the same Python worker (the partition stayed with its worker);
* ``exactly-once, task commit, moved``: the partition's last batch ran on another
  worker, whose new producer fenced this worker's: the task finds its pooled producer
  fenced at the marker's offset and starts a new one (``init_transactions()``, a
  marker read).

Tasks run ``GAP_SECONDS`` apart (a partition's tasks are a batch apart in a query, and
the broker writes a transaction's markers after its commit returns); the four tasks of
a batch of ``BATCH_OF_4`` run one after another, and its batches that far apart.
Rounds interleave the modes; each figure is the median of the rounds.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import psutil
import pyarrow as pa
from confluent_kafka.admin import AdminClient

from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.topics import create_topic
from eos_connectors.dev.compare.process import cpu_seconds, local_broker
from eos_connectors.sinks.kafka.at_least_once import KafkaAtLeastOnceWriter
from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter
from eos_connectors.sinks.kafka.exactly_once import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.options import KafkaSinkOptions, parse_options
from eos_connectors.sinks.kafka.pool import ClientPool, PlainProducers

ROWS = 2_500
GAP_SECONDS = 0.05
WARM_UP = 3
BATCH_OF_4 = "exactly-once, batch commit, 4 tasks a batch"
MODES = (
    "at-least-once",
    "exactly-once, batch commit",
    BATCH_OF_4,
    "exactly-once, task commit",
    "exactly-once, task commit, moved",
)


@dataclass(frozen=True)
class TaskCost:
    """One mode's median task: wall time, this process's CPU and the broker's (None
    when the broker is not on this machine), in milliseconds."""

    mode: str
    wall_ms: float
    client_cpu_ms: float
    broker_cpu_ms: float | None

    @property
    def together_ms(self) -> float | None:
        """Client and broker CPU; None when the broker's is unknown."""
        return None if self.broker_cpu_ms is None else self.client_cpu_ms + self.broker_cpu_ms


def run(bootstrap: str, tasks: int, rounds: int, out_dir: Path) -> list[TaskCost]:
    """Measure every mode ``rounds`` times, ``tasks`` tasks each; print the table and
    write ``kafka-cpu.json`` to ``out_dir``."""
    topic = f"eos-bench-kafka-cpu-{uuid.uuid4().hex[:8]}"
    create_topic(plaintext(bootstrap), topic, 4)
    create_topic(plaintext(bootstrap), f"{topic}-markers", 1, **{"cleanup.policy": "compact"})
    try:
        options = parse_options(
            {
                "kafka.bootstrap.servers": bootstrap,
                "topic": topic,
                "markerLogTopic": f"{topic}-markers",
            }
        )
        broker = local_broker(bootstrap)
        quiet = min(5.0, tasks * GAP_SECONDS)
        idle_before = _idle_rate(broker, seconds=quiet)
        raw: dict[str, list[tuple[TaskCost, float]]] = {mode: [] for mode in MODES}
        for _ in range(rounds):
            for mode in MODES:
                raw[mode].append(_measure(mode, _task(mode, options), tasks, broker))
        # The broker's own background work (a log cleaner, a previous load's tail) can
        # make one idle sample high, and every cost below it negative: the lower of two
        # samples, before and after, is its floor.
        idle = min(idle_before, _idle_rate(broker, seconds=quiet))
        measured = {
            m: [_less_idle(c, s, idle, measured_tasks(m, tasks)) for c, s in runs]
            for m, runs in raw.items()
        }
    finally:
        AdminClient({"bootstrap.servers": bootstrap}).delete_topics([topic, f"{topic}-markers"])
    results = [_median(costs) for costs in measured.values()]
    print("\n".join(table(results)))
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "kafka-cpu.json").write_text(
        json.dumps(
            {
                "rows": ROWS,
                "tasks": tasks,
                "rounds": rounds,
                "local_broker": broker is not None,
                "results": [asdict(r) for r in results],
            },
            indent=2,
        )
    )
    return results


def table(results: list[TaskCost]) -> list[str]:
    """A markdown table, with each CPU figure's ratio to at-least-once's."""
    base = results[0]
    lines = [
        "| task | wall ms | client CPU ms | broker CPU ms | CPU together |",
        "|---|--:|--:|--:|--:|",
    ]
    for r in results:
        lines.append(
            f"| {r.mode} | {r.wall_ms:.1f} | {r.client_cpu_ms:.1f} | "
            f"{_with_ratio(r.broker_cpu_ms, base.broker_cpu_ms)} | "
            f"{_with_ratio(r.together_ms, base.together_ms)} |"
        )
    return lines


def _with_ratio(value: float | None, base: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.1f} ({value / base:.1f}x)" if base and base > 0 else f"{value:.1f}"


def _task(mode: str, options: KafkaSinkOptions) -> Callable[[int], object]:
    """One task of ``mode`` for batch ``b``: task partition 0, always the same rows (four
    tasks of batch ``b``, partitions 0-3, in :data:`BATCH_OF_4`)."""
    batch = _rows()
    if mode == "at-least-once":
        plain = KafkaAtLeastOnceWriter(replace(options, exactly_once=False))
        producers = PlainProducers()
        return lambda b: plain.write_rows(iter([batch]), producers)
    if mode in ("exactly-once, batch commit", BATCH_OF_4):
        return _batch_commit_task(options, batch, tasks_per_call(mode))
    writer = KafkaExactlyOnceWriter(options)
    query = str(uuid.uuid4())
    # two Python workers; "moved" alternates between them, so each task finds its
    # worker's producer fenced by the other's last one
    pools = [ClientPool(), ClientPool()]
    moved = mode.endswith("moved")

    def task(b: int) -> object:
        identity = TaskIdentity(query, "bench", "run", b, 0, b)
        return writer.write_task(identity, iter([batch]), pools[b % 2 if moved else 0])

    return task


def _batch_commit_task(
    options: KafkaSinkOptions, batch: pa.RecordBatch, per_batch: int
) -> Callable[[int], object]:
    """Batch ``b`` of the batch commit: ``per_batch`` tasks (task partitions 0 to
    ``per_batch - 1``, one after another), then the driver's commit of them all; a call
    is ``per_batch`` tasks (:func:`tasks_per_call`)."""
    writer = BatchCommitWriter(options)
    query = str(uuid.uuid4())

    def tasks(b: int) -> object:
        prepared = [
            writer.write_task(TaskIdentity(query, "bench", "run", b, p, b), iter([batch]))
            for p in range(per_batch)
        ]
        writer.commit(list(prepared), b)  # a list of commit messages (invariance)
        return prepared

    return tasks


def tasks_per_call(mode: str) -> int:
    """How many tasks one call of ``mode``'s :func:`_task` runs."""
    return 4 if mode == BATCH_OF_4 else 1


def _rows() -> pa.RecordBatch:
    keys = pa.array([f"key-{i:05d}" for i in range(ROWS)])
    values = pa.array([f"{i:012d}".ljust(100, "x") for i in range(ROWS)])
    return pa.record_batch([keys, values], names=["key", "value"])


def _measure(
    mode: str, task: Callable[[int], object], tasks: int, broker: psutil.Process | None
) -> tuple[TaskCost, float]:
    """One mode's costs per task over :func:`measured_tasks` tasks, the broker's CPU
    still with its idle work, and the seconds they took."""
    per_call, count = tasks_per_call(mode), measured_tasks(mode, tasks)
    for b in range(WARM_UP):
        task(b)
        time.sleep(GAP_SECONDS)
    walls = []
    began, client, broker_before = time.monotonic(), time.process_time(), cpu_seconds(broker)
    for b in range(WARM_UP, WARM_UP + count // per_call):
        time.sleep(GAP_SECONDS)
        since = time.perf_counter()
        task(b)
        walls.append((time.perf_counter() - since) * 1000 / per_call)
    elapsed = time.monotonic() - began
    client_ms = (time.process_time() - client) * 1000 / count
    broker_ms = None
    if broker is not None:
        broker_ms = (cpu_seconds(broker) - broker_before) * 1000 / count
    return TaskCost(mode, statistics.median(walls), client_ms, broker_ms), elapsed


def measured_tasks(mode: str, tasks: int) -> int:
    """``tasks`` rounded up to whole calls of ``mode`` (at least one)."""
    per_call = tasks_per_call(mode)
    return max(1, -(-tasks // per_call)) * per_call


def _less_idle(cost: TaskCost, elapsed: float, idle: float, tasks: int) -> TaskCost:
    """``cost`` without the broker's idle work over ``elapsed`` seconds."""
    if cost.broker_cpu_ms is None:
        return cost
    return replace(cost, broker_cpu_ms=cost.broker_cpu_ms - idle * elapsed * 1000 / tasks)


def _idle_rate(broker: psutil.Process | None, seconds: float) -> float:
    """The broker's CPU seconds per second with nothing to do (0 when not local)."""
    if broker is None:
        return 0.0
    before = cpu_seconds(broker)
    time.sleep(seconds)
    return (cpu_seconds(broker) - before) / seconds


def _median(costs: list[TaskCost]) -> TaskCost:
    brokers = [c.broker_cpu_ms for c in costs if c.broker_cpu_ms is not None]
    return TaskCost(
        costs[0].mode,
        statistics.median(c.wall_ms for c in costs),
        statistics.median(c.client_cpu_ms for c in costs),
        statistics.median(brokers) if brokers else None,
    )
