"""The two phases each pipeline runs through, on the same broker, data and machine.

* **throughput**: ``records`` keyed records (~100 bytes, 10,000 keys) are in the
  input topic before the pipeline starts, and Spark reads ``batch_records`` of them
  per batch. The first batch (or Quix's and the raw loop's first commit) carries
  the start-up (JVM, Python workers, first plans) and is reported apart as start-up
  time. Then every pipeline warms up for dozens of batches (the JVM's JIT, the
  Python workers, caches: batch times of a Spark pipeline fall by half over its
  first 30-40 batches), so records/s is measured over the second half of the
  records only (:data:`WARM_UP`): the records of the batches past the first half,
  divided by the time from the commit of the batch before them to the last one's.
  The commit times, the per-batch split and the CPU are of the same batches; the
  peak memory is of the whole phase. At its end every key's count in the sink is
  checked against the input.
* **latency and recovery**: records are produced at a steady ``rate`` onto 1,000
  keys, each stamped with its produce time. A watcher reads the sink (Kafka
  under read_committed, PostgreSQL and Redis by polling) and notes when each
  key's count grows; a record is visible when its key's count reaches it, and
  its latency is that moment minus its timestamp. After ``latency_seconds`` the
  pipeline is SIGKILLed and started again: recovery is the time from the kill to
  the new process's first committed batch. Production goes on, and the phase
  ends when every record is counted in the sink. ``latency_seconds`` 0 skips it.

With ``rounds`` above 1 the throughput phase runs that many times, interleaved (every
pipeline's first round, then every pipeline's second, ...), so a drift of the machine
falls on every pipeline alike; a pipeline reports its median round, and a ratio of two
pipelines is the median of their ratios within a round.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.compare import pipelines as pl
from eos_connectors.dev.compare.process import CpuClock, PipelineProcess, local_broker
from eos_connectors.dev.endpoints import Endpoints

LATENCY_KEYS = 1_000
LATENCY_MAX_OFFSETS = 1_000_000  # no cap: each batch takes what arrived meanwhile
WARM_UP_SECONDS = 5.0  # after the sink first shows a count: steady state from here
#: Share of the throughput phase's records read before records/s is measured. A first
#: run of 40 batches of 100,000 records (this machine, 2 cores) showed every Spark
#: pipeline's batch times still falling at batch 10, where the phase used to end:
#: Spark's Kafka connector from 1,163 to ~400 ms, this package's from ~800 to ~450.
WARM_UP = 0.5
BATCH_RECORDS = 100_000  # the throughput phase's batch (Spark's maxOffsetsPerTrigger)
AFTER_KILL_SECONDS = 8.0
START_TIMEOUT = 180.0


@dataclass
class Result:
    pipeline: pl.Pipeline
    records: int = 0
    seconds: float = 0.0
    startup_s: float = 0.0
    commit_ms: list[float] = field(default_factory=list)
    latencies_ms: list[float] = field(default_factory=list)
    recovery_s: float | None = None
    driver_mb: float = 0.0
    workers_mb: float = 0.0
    stages_ms: dict[str, float] = field(default_factory=dict)  # Spark's per-batch split
    latency_stages_ms: dict[str, float] = field(default_factory=dict)  # the paced phase's
    round_rates: list[float] = field(default_factory=list)  # records/s of each round
    #: The warm-up half's records and seconds (after the start-up batch, up to where
    #: records/s starts), so a report can show how far a ratio moves once warm
    warmup_records: int = 0
    warmup_seconds: float = 0.0
    round_warmup_rates: list[float] = field(default_factory=list)
    #: CPU seconds of the throughput phase's measured interval: "pipeline", "broker"
    cpu_s: dict[str, float] = field(default_factory=dict)
    error: str | None = None

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def warmup_rate(self) -> float:
        return self.warmup_records / self.warmup_seconds if self.warmup_seconds else 0.0

    def latency(self, quantile: float) -> float | None:
        if len(self.latencies_ms) < 2:
            return None
        return statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[
            round(quantile * 100) - 1
        ]

    def commit_p50(self) -> float | None:
        return statistics.median(self.commit_ms) if self.commit_ms else None

    def cpu_ms_per_1k(self, who: str) -> float | None:
        """CPU milliseconds ``who`` ("pipeline", "broker") spent per 1,000 records."""
        if who not in self.cpu_s or not self.records:
            return None
        return self.cpu_s[who] * 1e6 / self.records


@dataclass(frozen=True)
class Settings:
    records: int
    keys: int
    rate: int
    latency_seconds: float
    work_dir: Path
    rounds: int = 1
    batch_records: int = BATCH_RECORDS


def start(target: pl.Target, endpoints: Endpoints, max_offsets: int) -> PipelineProcess:
    env = {"EOS_COMMIT_TIMES": str(target.commit_times), "EOS_SPARK_LOG_LEVEL": "ERROR"}
    log = target.state_dir / "pipeline.log"
    cpu = CpuClock(local_broker(endpoints.kafka_bootstrap))
    return PipelineProcess(pl.command(target, endpoints, max_offsets), log, env, cpu=cpu).start()


# -- throughput -------------------------------------------------------------------------


def throughput(
    pipeline: pl.Pipeline, topic: str, endpoints: Endpoints, s: Settings, result: Result
) -> None:
    target = pl.new_target(pipeline, topic, endpoints, s.work_dir)
    process = start(target, endpoints, s.batch_records)
    try:
        process.wait_for("start", lambda: process.ready_at() is not None, START_TIMEOUT)
        process.wait_for(
            f"{s.records:,} records",
            lambda: process.records() >= s.records,
            START_TIMEOUT + s.records / 2_000,
        )
    finally:
        process.kill()
    first, *batches = process.batches()
    result.startup_s = first["t"] - (process.ready_at() or first["t"])
    clock, *measured = warmed_up(batches, pipeline.key)
    result.records = sum(int(b["records"]) for b in measured)
    result.seconds = measured[-1]["t"] - clock["t"]
    result.warmup_records = sum(int(b["records"]) for b in batches) - result.records
    result.warmup_seconds = clock["t"] - first["t"]
    result.commit_ms = _commit_times(measured, target)
    result.stages_ms = _stages(measured, target) if pipeline.spark else {}
    result.driver_mb, result.workers_mb = process.memory.driver_mb, process.memory.workers_mb
    result.cpu_s = _cpu_used(process.cpu, clock["t"], measured[-1]["t"])
    _check_counts(target, endpoints, s.records)
    pl.clean_up(target, endpoints)


def warmed_up(batches: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """The batches after the start-up batch whose records come after the first
    :data:`WARM_UP` share, led by the batch before them (its commit starts the clock)."""
    total = sum(int(b["records"]) for b in batches)
    seen = 0
    for index, batch in enumerate(batches):
        if index and seen >= WARM_UP * total:
            return batches[index - 1 :]
        seen += int(batch["records"])
    raise AssertionError(
        f"{key}: {len(batches) + 1} batches, too few to leave out a warm-up; "
        "give it more records or a smaller --batch-records"
    )


def _cpu_used(cpu: CpuClock, start: float, end: float) -> dict[str, float]:
    used = cpu.between(start, end)
    if used is None:
        return {}
    pipeline, broker = used
    return {"pipeline": pipeline} | ({} if broker is None else {"broker": broker})


def _sink_commits(target: pl.Target) -> dict[int, float]:
    """The eos sinks' commit of each batch: the driver's (PostgreSQL, Redis), or the
    slowest of the tasks' transactions, which commit in parallel (Kafka)."""
    commits: dict[int, float] = {}
    for entry in _timings(target):
        if "stage" not in entry:
            commits[int(entry["batch"])] = max(commits.get(int(entry["batch"]), 0.0), entry["ms"])
    return commits


def _timings(target: pl.Target) -> list[dict[str, Any]]:
    if not target.commit_times.exists():
        return []
    return [json.loads(line) for line in target.commit_times.read_text().splitlines()]


def _task_stages(target: pl.Target, batch_ids: set[int] | None = None) -> dict[str, float]:
    """Our tasks' time per batch in each stage ("source read", "sink write") and step,
    summed over the batch's tasks (they share the cores), averaged over the batches
    ``batch_ids`` (all when None: the first batch's warm-up is the caller's to drop)."""
    per_batch: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for entry in _timings(target):
        if "stage" in entry and (batch_ids is None or int(entry["batch"]) in batch_ids):
            per_batch[entry["stage"]][int(entry["batch"])] += float(entry["ms"])
    return {
        f"{stage} (task ms)": statistics.mean(batches.values())
        for stage, batches in per_batch.items()
    }


def _commit_times(batches: list[dict[str, Any]], target: pl.Target) -> list[float]:
    """Spark: the sink's commit plus Spark's commit-log write; Quix and the raw loop:
    the transaction's commit (with Quix's flushes) as they report it."""
    if not target.pipeline.spark:
        return [float(b["commit_ms"]) for b in batches]
    sink = _sink_commits(target)
    return [sink.get(b["batch"], 0.0) + b["durations"].get("commitOffsets", 0) for b in batches]


def _stages(batches: list[dict[str, Any]], target: pl.Target) -> dict[str, float]:
    """Mean ms per batch of each part of Spark's batch, and of the sink's commit."""
    parts: dict[str, list[float]] = defaultdict(list)
    for batch in batches:
        for name, ms in batch["durations"].items():
            parts[name].append(float(ms))
    stages = {name: statistics.mean(values) for name, values in parts.items()}
    ids = {int(batch["batch"]) for batch in batches}
    sink = {batch: ms for batch, ms in _sink_commits(target).items() if batch in ids}
    if sink:
        stages["sink commit (part of addBatch)"] = statistics.mean(sink.values())
    return stages | _task_stages(target, ids)


def _check_counts(target: pl.Target, endpoints: Endpoints, records: int) -> None:
    counts = pl.visible_counts(target, endpoints)
    total = sum(counts.values())
    if total != records:
        raise AssertionError(
            f"{target.pipeline.key}: the sink's counts add up to {total:,}, not {records:,} "
            f"(output {target.output})"
        )


# -- latency and recovery ------------------------------------------------------------------


@dataclass
class Visibility:
    """When each key's count was seen to reach each value."""

    seen: dict[str, list[tuple[int, float]]] = field(default_factory=lambda: defaultdict(list))
    latest: dict[str, int] = field(default_factory=dict)

    def note(self, counts: dict[str, int], at: float) -> None:
        for key, count in counts.items():
            if count > self.latest.get(key, 0):
                self.latest[key] = count
                self.seen[key].append((count, at))

    def total(self) -> int:
        return sum(self.latest.values())


def _watch(watcher: Any, visibility: Visibility, stop: threading.Event) -> None:
    while not stop.is_set():
        visibility.note(watcher.poll(), time.time())
        time.sleep(watcher.interval)
    watcher.close()


@dataclass
class PacedInput:
    """Records produced at ``rate`` per second, round-robin over the keys; the produce
    time of each key's n-th record."""

    bootstrap: str
    topic: str
    rate: int
    stamps: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    produced: int = 0

    def run_while(self, going: Callable[[], bool]) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 2})
        keys = [f"key-{k:08d}" for k in range(LATENCY_KEYS)]
        tick = 0.01
        per_tick = max(1, round(self.rate * tick))
        next_tick = time.time()
        while going():
            now = time.time()
            for _ in range(per_tick):
                key = keys[self.produced % LATENCY_KEYS]
                producer.produce(
                    self.topic, key=key.encode(), value=b"x" * 100, timestamp=int(now * 1000)
                )
                self.stamps[key].append(now)
                self.produced += 1
            producer.poll(0)
            next_tick += tick
            time.sleep(max(0.0, next_tick - time.time()))
        producer.flush(30)


def latency_and_recovery(
    pipeline: pl.Pipeline, endpoints: Endpoints, s: Settings, result: Result
) -> None:
    topic = f"eos-bench-paced-{pipeline.key}-{int(time.time())}"
    create_topic(endpoints.kafka_bootstrap, topic, pl.PARTITIONS)
    target = pl.new_target(pipeline, topic, endpoints, s.work_dir)
    keys = [f"key-{k:08d}" for k in range(LATENCY_KEYS)]
    visibility = Visibility()
    stop = threading.Event()
    process = start(target, endpoints, LATENCY_MAX_OFFSETS)
    try:
        process.wait_for("start", lambda: process.ready_at() is not None, START_TIMEOUT)
        watcher = pl.watcher(target, endpoints, keys)
        threading.Thread(target=_watch, args=(watcher, visibility, stop), daemon=True).start()
        paced = PacedInput(endpoints.kafka_bootstrap, topic, s.rate)
        paced.run_while(lambda: visibility.total() == 0 and process.alive())
        since = time.time() + WARM_UP_SECONDS
        paced.run_while(lambda: time.time() < since + s.latency_seconds)
        steady = [b for b in process.batches() if b["t"] >= since]
        killed_at = process.kill()
        if steady and pipeline.spark:
            steady_stages = _stages(steady, target)
            steady_stages["batch interval"] = (
                (steady[-1]["t"] - steady[0]["t"]) / max(1, len(steady) - 1) * 1000
            )
            result.latency_stages_ms = steady_stages
        process = start(target, endpoints, LATENCY_MAX_OFFSETS)
        resume_until = time.time() + AFTER_KILL_SECONDS
        producing = threading.Thread(
            target=paced.run_while, args=(lambda: time.time() < resume_until,)
        )
        producing.start()
        process.wait_for(
            "a batch after the restart", lambda: bool(process.batches()), START_TIMEOUT
        )
        result.recovery_s = process.batches()[0]["t"] - killed_at
        producing.join()
        process.wait_for(
            "every record in the sink", lambda: visibility.total() >= paced.produced, START_TIMEOUT
        )
    finally:
        stop.set()
        process.kill()
    if visibility.total() != paced.produced:
        raise AssertionError(
            f"{pipeline.key}: {visibility.total():,} counted in the sink, "
            f"{paced.produced:,} produced"
        )
    result.latencies_ms = _latencies(paced.stamps, visibility, since, killed_at)
    pl.clean_up(target, endpoints)


def _latencies(
    stamps: dict[str, list[float]], visibility: Visibility, since: float, until: float
) -> list[float]:
    """Each record produced in [since, until) and visible before ``until``: visible - stamp."""
    latencies = []
    for key, seen in visibility.seen.items():
        produced = stamps[key]
        shown = 0
        for count, at in seen:
            if at >= until:
                break
            for stamp in produced[shown:count]:
                if stamp >= since:
                    latencies.append((at - stamp) * 1000)
            shown = count
    return latencies


def run_all(
    chosen: list[pl.Pipeline], topic: str, endpoints: Endpoints, s: Settings
) -> list[Result]:
    """Every pipeline through both phases (the throughput phase ``s.rounds`` times,
    interleaved); a pipeline that fails is reported with its error, not hidden, and
    runs no further round."""
    rounds: dict[str, list[Result]] = {p.key: [] for p in chosen}
    failed: dict[str, Result] = {}
    for number in range(1, s.rounds + 1):
        of = f" (round {number} of {s.rounds})" if s.rounds > 1 else ""
        for pipeline in (p for p in chosen if p.key not in failed):
            result = Result(pipeline)
            print(f"  {pipeline.key}: throughput{of}...", flush=True)
            if _phase(result, partial(throughput, pipeline, topic, endpoints, s, result)):
                print(f"  {pipeline.key}: {result.rate:,.0f} records/s", flush=True)
                rounds[pipeline.key].append(result)
            else:
                failed[pipeline.key] = result
    results = [failed.get(p.key) or median_round(rounds[p.key]) for p in chosen]
    for result in results:
        if not result.error and s.latency_seconds > 0:
            print(f"  {result.pipeline.key}: latency, recovery...", flush=True)
            _phase(result, partial(latency_and_recovery, result.pipeline, endpoints, s, result))
    return results


def _phase(result: Result, phase: Callable[[], None]) -> bool:
    try:
        phase()
        return True
    except (RuntimeError, TimeoutError, AssertionError) as exc:
        print(f"  {result.pipeline.key}: FAILED: {exc}", flush=True)
        result.error = str(exc)
        return False


def median_round(rounds: list[Result]) -> Result:
    """The round with the median records/s (the lower of the two middle ones), carrying
    every round's records/s, measured and of the warm-up."""
    rates = [r.rate for r in rounds]
    median = next(r for r in rounds if r.rate == statistics.median_low(rates))
    median.round_rates = rates
    median.round_warmup_rates = [r.warmup_rate for r in rounds]
    return median


def work_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="eos-bench-"))
