"""The two phases each pipeline runs through in every round, on the same broker, data
and machine; what each round measured. The rounds, their order and when they stop
are :mod:`schedule`'s.

* **throughput**: ``records`` keyed records (~100 bytes, 10,000 keys) are in the
  input topic before the pipeline starts, and Spark reads ``batch_records`` of them
  per batch. Records/s is given twice: over the whole run (every record, from the
  start call to the last commit) and in steady state (the records past the first
  :data:`WARM_UP` share, from the commit of the batch before them to the last one's:
  the JVM's JIT, the Python workers and the caches take dozens of batches to warm).
  The commit times, the per-batch split and the CPU are of the steady batches; the
  peak memory is of the whole phase. At its end every key's count in the sink is
  checked against the input.
* **latency and recovery**: records are produced at a steady ``rate`` onto 1,000
  keys, each stamped with its produce time. A watcher reads the sink (Kafka under
  read_committed, PostgreSQL and Redis by polling) and notes when each key's count
  grows; a record is visible when its key's count reaches it, and its latency is
  that moment minus its timestamp. The records of ``latency_seconds`` of steady
  state are measured, every one of them to its visibility (production goes on
  meanwhile); then the pipeline is SIGKILLed and started again: recovery is the
  time from the kill to the new process's first committed batch. Production goes
  on, and the phase ends when every record is counted in the sink.
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
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.compare import pipelines as pl
from eos_connectors.dev.compare import process, stats
from eos_connectors.dev.compare.process import CpuClock, PipelineProcess, local_broker
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.release_venv import HIGHEST

LATENCY_KEYS = 1_000
LATENCY_MAX_OFFSETS = 1_000_000  # no cap: each batch takes what arrived meanwhile
WARM_UP_SECONDS = 5.0  # after the sink first shows a count: steady state from here
#: Share of the throughput phase's records read before steady-state records/s is
#: measured. A run of 40 batches of 100,000 records (2 cores) showed every Spark
#: pipeline's batch times still falling at batch 10: Spark's Kafka connector from
#: 1,163 to ~400 ms, this package's from ~800 to ~450.
WARM_UP = 0.5
BATCH_RECORDS = 100_000  # the throughput phase's batch (Spark's maxOffsetsPerTrigger)
#: The throughput phase's records by default. A longer run (``--records``) also measures
#: the steady state this many records give (their second half: records 1M-2M), the
#: measure of every run before 2026-12-05, so that its report shows both side by side.
RECORDS = 2_000_000
AFTER_KILL_SECONDS = 8.0
START_TIMEOUT = 180.0
#: How long the records of the latency window may take to become visible before the
#: kill; a pipeline slower than that has no steady state at this rate.
VISIBLE_TIMEOUT = 60.0


@dataclass
class Round:
    """What one round measured of one pipeline (the latency figures stay None in a
    round that ran only the throughput phase)."""

    number: int
    records: int = 0  # steady state: records and seconds
    seconds: float = 0.0
    #: A run longer than RECORDS: the steady state of its first RECORDS (0: not measured)
    early_records: int = 0
    early_seconds: float = 0.0
    whole_records: int = 0  # the whole run: every record, start call to last commit
    whole_seconds: float = 0.0
    startup_s: float = 0.0  # the query ready to its first commit
    first_commit_s: float = 0.0  # the process started to the first commit
    outputs: int = 0  # records written to the sink over the whole phase
    commit_ms: list[float] = field(default_factory=list)
    stages_ms: dict[str, float] = field(default_factory=dict)  # Spark's per-batch split
    #: CPU seconds of the steady interval: "pipeline", "broker", and the pipeline's
    #: parts (process.PARTS, "jvm-gc", "jvm-jit"; not in reports before 2026-12-05)
    cpu_s: dict[str, float] = field(default_factory=dict)
    #: The machine's speed probe over the steady interval (process.SpeedProbe: CPU ms
    #: of a fixed piece of work, lower is faster; None before 2026-12-05)
    probe_ms: float | None = None
    rss_mb: dict[str, float] = field(default_factory=dict)  # peak per process.PARTS
    pss_mb: dict[str, float] = field(default_factory=dict)
    latency_p50_ms: float | None = None
    latency_p99_ms: float | None = None
    latency_samples: int = 0
    recovery_s: float | None = None
    latency_stages_ms: dict[str, float] = field(default_factory=dict)  # the paced phase's

    @property
    def rate(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def early_rate(self) -> float | None:
        """Steady records/s over the first :data:`RECORDS` of a longer run, else None."""
        return self.early_records / self.early_seconds if self.early_seconds else None

    @property
    def whole_rate(self) -> float:
        return self.whole_records / self.whole_seconds if self.whole_seconds else 0.0

    def commit_p50(self) -> float | None:
        return statistics.median(self.commit_ms) if self.commit_ms else None

    def cpu_us_per_record(self, who: str = "pipeline") -> float | None:
        """CPU microseconds ``who`` ("pipeline", "broker", a part: :attr:`cpu_s`) spent
        per steady record."""
        if who not in self.cpu_s or not self.records:
            return None
        return self.cpu_s[who] * 1e6 / self.records

    def pss(self, part: str) -> float | None:
        """A part's PSS (:data:`~.process.PARTS`; ``workers``: every Python process but
        the driver; ``pipeline``: every process), None when not measured."""
        if part == "pipeline":
            return process.total(self.pss_mb) or None
        if part == "workers":
            return process.workers(self.pss_mb) or None
        return self.pss_mb.get(part) or None


@dataclass
class Result:
    """A pipeline's rounds; ``error`` when one of them failed (it ran no further)."""

    pipeline: pl.Pipeline
    rounds: list[Round] = field(default_factory=list)
    error: str | None = None

    def ratio_to(
        self,
        other: Result,
        figure: Callable[[Round], float | None],
        other_figure: Callable[[Round], float | None] | None = None,
    ) -> stats.Ratio | None:
        """This pipeline's ``figure`` over ``other``'s (``other_figure``, else the same),
        paired by round: the rounds both ran."""
        theirs = {r.number: (other_figure or figure)(r) for r in other.rounds}
        both = [r for r in self.rounds if r.number in theirs]
        return stats.paired([figure(r) for r in both], [theirs[r.number] for r in both])

    def median(self, figure: Callable[[Round], float | None]) -> float | None:
        values = [v for v in map(figure, self.rounds) if v is not None]
        return statistics.median(values) if values else None

    @property
    def rate(self) -> float:
        """The median round's steady records/s (0 before any round)."""
        return self.median(lambda r: r.rate) or 0.0

    def typical(self) -> Round | None:
        """The round of the median steady records/s (the lower of the two middle ones):
        its profile stands for the pipeline's."""
        if not self.rounds:
            return None
        middle = statistics.median_low([r.rate for r in self.rounds])
        return next(r for r in self.rounds if r.rate == middle)


@dataclass(frozen=True)
class Settings:
    records: int
    keys: int
    rate: int
    latency_seconds: float
    work_dir: Path
    rounds: int = 3  # every pipeline, both phases
    batch_records: int = BATCH_RECORDS
    max_rounds: int = 8  # throughput only, for the pairs still too uncertain
    reference_rounds: int = 2  # Quix and the raw loop
    precision: float = 0.03  # a pair's 95% interval, +- this share of its ratio
    # The PySpark release the pipelines ran on; None in a report written before it was
    # kept. The targets are the highest release's (release_venv.HIGHEST, `make bench`).
    pyspark: str | None = None

    @property
    def judged(self) -> bool:
        """Whether the targets judge this run: it ran on their release, or on one the
        report did not keep."""
        return self.pyspark in (None, HIGHEST)


def start(target: pl.Target, endpoints: Endpoints, max_offsets: int) -> PipelineProcess:
    env = {"EOS_COMMIT_TIMES": str(target.commit_times), "EOS_SPARK_LOG_LEVEL": "ERROR"}
    log = target.state_dir / "pipeline.log"
    cpu = CpuClock(local_broker(endpoints.kafka_bootstrap))
    return PipelineProcess(pl.command(target, endpoints, max_offsets), log, env, cpu=cpu).start()


# -- throughput -------------------------------------------------------------------------


def throughput(
    pipeline: pl.Pipeline, topic: str, endpoints: Endpoints, s: Settings, figures: Round
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
    every = process.batches()
    first, *batches = every
    figures.startup_s = first["t"] - (process.ready_at() or first["t"])
    figures.first_commit_s = first["t"] - process.started_at
    figures.whole_records = sum(int(b["records"]) for b in every)
    figures.whole_seconds = every[-1]["t"] - process.started_at
    figures.outputs = sum(_outputs(b) for b in every)
    clock, *measured = warmed_up(batches, pipeline.key)
    figures.records, figures.seconds = _span(clock, *measured)
    if s.records > RECORDS:
        early = warmed_up(first_records(every, RECORDS)[1:], pipeline.key)
        figures.early_records, figures.early_seconds = _span(*early)
    figures.commit_ms = _commit_times(measured, target)
    figures.stages_ms = _stages(measured, target) if pipeline.spark else {}
    figures.rss_mb, figures.pss_mb = dict(process.memory.rss_mb), dict(process.memory.pss_mb)
    figures.cpu_s = _cpu_used(process.cpu, clock["t"], measured[-1]["t"])
    figures.probe_ms = process.speed.median_between(clock["t"], measured[-1]["t"])
    _check_counts(target, endpoints, s.records, s.keys)
    pl.clean_up(target, endpoints)


def _outputs(batch: dict[str, Any]) -> int:
    """Records a batch wrote to its sink: as the sink reported them, else (this package's
    sinks and Spark's report none; the query is in complete mode) the rows of the state."""
    written = batch.get("outputs")
    return int(written if written is not None else batch.get("state_rows") or 0)


def _span(clock: dict[str, Any], *measured: dict[str, Any]) -> tuple[int, float]:
    """The records of the ``measured`` batches and their seconds since ``clock``'s commit."""
    return sum(int(b["records"]) for b in measured), measured[-1]["t"] - clock["t"]


def first_records(batches: list[dict[str, Any]], records: int) -> list[dict[str, Any]]:
    """The batches a run of ``records`` records would have had: up to the first one that
    brings the count to ``records`` (where such a run stops)."""
    seen = 0
    for index, batch in enumerate(batches):
        seen += int(batch["records"])
        if seen >= records:
            return batches[: index + 1]
    return batches


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
    return cpu.between(start, end) or {}


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


def _check_counts(target: pl.Target, endpoints: Endpoints, records: int, keys: int) -> None:
    counts = pl.visible_counts(target, endpoints)
    total = sum(counts.values())
    expected = pl.expected_visible(records, keys, target.pipeline.changes)
    if total != expected:
        raise AssertionError(
            f"{target.pipeline.key}: the sink's counts add up to {total:,}, not {expected:,} "
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

    def reached(self, counts: dict[str, int]) -> bool:
        """Whether every key's count has been seen at ``counts``' or beyond."""
        return all(self.latest.get(key, 0) >= count for key, count in counts.items())


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
    pipeline: pl.Pipeline, endpoints: Endpoints, s: Settings, figures: Round
) -> None:
    topic = f"eos-bench-paced-{pipeline.key}-{int(time.time())}"
    create_topic(endpoints.kafka, topic, pl.PARTITIONS)
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
        until = time.time()
        window = {key: len(stamps) for key, stamps in paced.stamps.items()}
        deadline = until + VISIBLE_TIMEOUT
        paced.run_while(lambda: not visibility.reached(window) and time.time() < deadline)
        if not visibility.reached(window):
            raise TimeoutError(
                f"the records of the latency window were not all visible within "
                f"{VISIBLE_TIMEOUT:.0f} s: no steady state at {s.rate:,} records/s"
            )
        steady = [b for b in process.batches() if b["t"] >= since]
        killed_at = process.kill()
        if steady and pipeline.spark:
            figures.latency_stages_ms = _stages(steady, target) | {
                "batch interval": (steady[-1]["t"] - steady[0]["t"])
                / max(1, len(steady) - 1)
                * 1000
            }
        process = start(target, endpoints, LATENCY_MAX_OFFSETS)
        resume_until = time.time() + AFTER_KILL_SECONDS
        producing = threading.Thread(
            target=paced.run_while, args=(lambda: time.time() < resume_until,)
        )
        producing.start()
        process.wait_for(
            "a batch after the restart", lambda: bool(process.batches()), START_TIMEOUT
        )
        figures.recovery_s = process.batches()[0]["t"] - killed_at
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
    latencies = _latencies(paced.stamps, visibility, since, until)
    figures.latency_samples = len(latencies)
    figures.latency_p50_ms = quantile(latencies, 0.5)
    figures.latency_p99_ms = quantile(latencies, 0.99)
    pl.clean_up(target, endpoints)


def quantile(values: list[float], q: float) -> float | None:
    if len(values) < 2:
        return None
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def _latencies(
    stamps: dict[str, list[float]], visibility: Visibility, since: float, until: float
) -> list[float]:
    """Each record produced in [since, until): the moment it was visible - its stamp."""
    latencies = []
    for key, seen in visibility.seen.items():
        produced = stamps[key]
        shown = 0
        for count, at in seen:
            for stamp in produced[shown:count]:
                if since <= stamp < until:
                    latencies.append((at - stamp) * 1000)
            shown = count
    return latencies


def work_dir() -> Path:
    return Path(tempfile.mkdtemp(prefix="eos-bench-"))
