"""``eos bench kafka-commit``: the Kafka sink's driver commit step, by tasks per batch.

In the default ``commitMode=batch`` each task leaves its transaction open and the
driver, once the batch is complete, writes the decision and ends every transaction
(:mod:`eos_connectors.sinks.kafka.batch_commit`). This measures that step alone, on
the real broker and without Spark: ``BatchCommitWriter.commit`` for a batch of 4, 32
and 200 prepared tasks (each ``ROWS`` rows into a 4-partition topic), as the driver
runs it. Its parts, each timed on its own afterwards against a batch of the same size:

* ``decision``: the pointer read and the decision written, record and pointer, in one
  transaction of the driver's kept claim of the decider
  (:mod:`eos_connectors.sinks.kafka.stream_decider`), as a stream's driver decides;
* ``plain``: the record and the pointer written plainly, as a stream's driver decided
  before it claimed the decider (no compare-and-set), for comparison;
* ``check``: the look for transactions begun again after another client's abort (one
  DescribeTransactions per coordinator: :meth:`~.coordinator.TransactionClient.rebegun`);
* ``end``: one ``EndTxn(commit)`` per transaction, all sent before any answer is awaited;
* ``sweep``: ListTransactions on every broker, DescribeTransactions of the sink's ids
  (nothing stray to abort here);
* ``client``: a transaction client made and closed (the driver keeps its own across
  commits; this is what its first commit pays).

Each figure is the median of ``--rounds`` batches, in milliseconds.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import pyarrow as pa

from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.topics import create_topic
from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter, PreparedTask
from eos_connectors.sinks.kafka.coordinator import TransactionClient
from eos_connectors.sinks.kafka.decisions import Decision, write_decision
from eos_connectors.sinks.kafka.options import ids_prefix, parse_options
from eos_connectors.sinks.kafka.stream_decider import Choose, deciding

ROWS = 100
TASKS = (4, 32, 200)
QUERY = "bench-commit"


@dataclass(frozen=True)
class CommitStep:
    """One batch size's median commit step and its parts, in milliseconds."""

    tasks: int
    commit_ms: float
    decision_ms: float
    plain_ms: float
    check_ms: float
    end_ms: float
    sweep_ms: float
    client_ms: float


def run(bootstrap: str, rounds: int, out_dir: Path) -> list[CommitStep]:
    """Measure each batch size of :data:`TASKS`, print a table, write kafka-commit.json."""
    steps = [_measure(bootstrap, tasks, rounds) for tasks in TASKS]
    print(
        "| tasks | commit step (ms) | decision | plain decision | begun-again check "
        "| EndTxn all | sweep | client |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in steps:
        print(
            f"| {s.tasks} | {s.commit_ms:.0f} | {s.decision_ms:.0f} | {s.plain_ms:.0f} "
            f"| {s.check_ms:.0f} | {s.end_ms:.0f} "
            f"| {s.sweep_ms:.0f} | {s.client_ms:.0f} |"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "kafka-commit.json").write_text(
        json.dumps([asdict(s) for s in steps], indent=2) + "\n"
    )
    return steps


def _measure(bootstrap: str, tasks: int, rounds: int) -> CommitStep:
    tag = uuid.uuid4().hex[:8]
    topic = f"bench-commit-{tasks}-{tag}"
    create_topic(plaintext(bootstrap), topic, 4)
    options = parse_options(
        {"kafka.bootstrap.servers": bootstrap, "topic": topic, "sinkId": f"bc{tasks}-{tag}"}
    )
    writer = BatchCommitWriter(options)
    sid = options.sink_id or ""
    kinds = ("commit", "decision", "plain", "check", "end", "sweep")
    parts: dict[str, list[float]] = {k: [] for k in kinds}
    parts["client"] = []
    for batch in range(rounds * 2):
        reports = _prepare(writer, batch, tasks)
        if batch % 2 == 0:  # the whole step, as the driver runs it
            parts["commit"].append(_ms(partial(writer.commit, list(reports), batch)))
            continue
        txns = {r.partition: r.txn for r in reports if r.txn is not None}
        decision = Decision(batch, QUERY, txns, sum(r.records for r in reports))
        parts["decision"].append(_ms(partial(deciding, options, sid, _deciding(decision))))
        parts["plain"].append(_ms(partial(write_decision, options, sid, decision)))
        began = time.perf_counter()
        client = TransactionClient(options.kafka)
        made = time.perf_counter()
        parts["check"].append(_ms(partial(client.rebegun, list(txns.values()))))
        made += parts["check"][-1] / 1000
        client.end(list(txns.values()), commit=True)
        ended = time.perf_counter()
        client.sweep(ids_prefix(options, sid), list(txns.values()))
        swept = time.perf_counter()
        client.close()
        parts["client"].append((made - began + time.perf_counter() - swept) * 1000)
        parts["end"].append((ended - made) * 1000)
        parts["sweep"].append((swept - ended) * 1000)
    median = {k: statistics.median(v) for k, v in parts.items()}
    return CommitStep(
        tasks,
        median["commit"],
        median["decision"],
        median["plain"],
        median["check"],
        median["end"],
        median["sweep"],
        median["client"],
    )


def _prepare(writer: BatchCommitWriter, batch: int, tasks: int) -> list[PreparedTask]:
    """Each task of the batch prepared (its transaction left open), one after another."""
    return [
        writer.write_task(
            TaskIdentity(QUERY, QUERY, "run", batch, p, batch * 1000 + p), iter(_rows(batch, p))
        )
        for p in range(tasks)
    ]


def _rows(batch: int, partition: int) -> list[pa.RecordBatch]:
    values = [f"b{batch}-p{partition}-r{i}".encode() for i in range(ROWS)]
    keys = [f"k{i % 16}".encode() for i in range(ROWS)]
    return [pa.RecordBatch.from_arrays([pa.array(keys), pa.array(values)], ["key", "value"])]


def _deciding(decision: Decision) -> Choose:
    """A commit's choice that writes ``decision`` whatever the pointer says."""
    return lambda _pointed, write: write(decision)


def _ms(step: Callable[[], object]) -> float:
    began = time.perf_counter()
    step()
    return (time.perf_counter() - began) * 1000
