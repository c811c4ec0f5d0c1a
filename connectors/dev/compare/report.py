"""The comparison's report: tables of figures and verdicts, a PNG chart; no prose (what
each figure means is in docs/bench.md, which the report links)."""

from __future__ import annotations

import os
import platform
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from eos_connectors.core.errors import ConfigError
from eos_connectors.dev.compare import process, stats
from eos_connectors.dev.compare.pipelines import PAIRS, PIPELINES, QUIX_PYTHON
from eos_connectors.dev.compare.runner import RECORDS, Result, Round, Settings
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.release_venv import HIGHEST

#: docs/bench.md from docs/bench/RUN/, where the repository keeps each run's report
DOCS = "../../bench.md"
Figure = Callable[[Round], float | None]


def _rate(r: Round) -> float | None:
    return r.rate or None


def _p50(r: Round) -> float | None:
    return r.latency_p50_ms


def _recovery(r: Round) -> float | None:
    return r.recovery_s


def _workers(r: Round) -> float | None:
    return r.pss("workers")


def _jvm(r: Round) -> float | None:
    return r.pss("jvm")


def _pipeline(r: Round) -> float | None:
    return r.pss("pipeline")


def _whole_rate(r: Round) -> float | None:
    return r.whole_rate or None


def _startup(r: Round) -> float | None:
    return r.startup_s or None


def _startup_and_a_second(r: Round) -> float | None:
    return r.startup_s + 1.0 if r.startup_s else None


@dataclass(frozen=True)
class Target:
    """``pipeline``'s ``figure`` over ``baseline``'s ``baseline_figure``, round by
    round: at least ``bound`` (``at_least``) or at most."""

    label: str
    pipeline: str
    baseline: str
    bound: float
    figure: Figure = _rate
    baseline_figure: Figure | None = None  # the same figure when None
    at_least: bool = True

    def ratio(self, by_key: dict[str, Result]) -> stats.Ratio | None:
        mine, other = by_key.get(self.pipeline), by_key.get(self.baseline)
        if mine is None or other is None:
            return None
        return mine.ratio_to(other, self.figure, self.baseline_figure)

    def met(self, ratio: stats.Ratio) -> bool:
        return ratio.estimate >= self.bound if self.at_least else ratio.estimate <= self.bound


_SINKS = (("Kafka", "kafka"), ("PostgreSQL", "postgres"), ("Redis", "redis"))
_EOS_KEYS = tuple(p.key for p in PIPELINES if p.engine == "eos" and not p.changes)
TARGETS = (
    Target("eos-kafka records/s >= 1.1x Spark's JVM connector's", "eos-kafka", "spark-kafka", 1.1),
    Target(
        "eos-kafka whole-run records/s (start-up included) >= 1.0x Spark's JVM connector's",
        "eos-kafka",
        "spark-kafka",
        1.0,
        _whole_rate,
    ),
    Target(
        "eos-kafka start-up <= Spark's JVM connector's + 1 s",
        "eos-kafka",
        "spark-kafka",
        1.0,
        _startup,
        _startup_and_a_second,
        at_least=False,
    ),
    *(
        Target(
            f"{name}: exactly-once records/s >= 0.95x at-least-once's",
            f"eos-{sink}",
            f"eos-{sink}-alo",
            0.95,
        )
        for name, sink in _SINKS
    ),
    Target(
        "eos-kafka latency p50 <= Spark's JVM connector's",
        "eos-kafka",
        "spark-kafka",
        1.0,
        _p50,
        at_least=False,
    ),
    Target(
        "eos-kafka recovery <= Spark's JVM connector's",
        "eos-kafka",
        "spark-kafka",
        1.0,
        _recovery,
        at_least=False,
    ),
    *(
        Target(
            f"{key}: whole pipeline's memory (PSS) <= 1.2x the JVM connector's pipeline",
            key,
            "spark-kafka",
            1.2,
            _pipeline,
            at_least=False,
        )
        for key in _EOS_KEYS
    ),
    *(  # the earlier measure, kept beside the whole pipeline's
        Target(
            f"{key}: Python workers' memory (PSS) <= 1.5x the JVM connector's JVM",
            key,
            "spark-kafka",
            1.5,
            _workers,
            _jvm,
            at_least=False,
        )
        for key in _EOS_KEYS
    ),
    Target(
        "PostgreSQL change stream (20% deletes): exactly-once records/s >= 0.9x at-least-once's",
        "eos-pg-changes",
        "eos-pg-changes-alo",
        0.9,
    ),
)


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _spread(result: Result, figure: Figure, digits: int = 0) -> str:
    """``median (low-high)`` over the rounds that measured it."""
    found = stats.spread([figure(r) for r in result.rounds])
    if found is None:
        return "-"
    middle, low, high = found
    if low == high:
        return _num(middle, digits)
    return f"{_num(middle, digits)} ({_num(low, digits)}-{_num(high, digits)})"


def _row(result: Result, *cells: str, rounds: int | None = None) -> str:
    """A table row: the pipeline, its guarantee, the rounds its figures come from (all
    its rounds unless ``rounds`` says), then ``cells``."""
    p = result.pipeline
    counted = len(result.rounds) if rounds is None else rounds
    return "| " + " | ".join((p.key, p.guarantee, str(counted), *cells)) + " |"


def _table(columns: tuple[str, ...], rows: list[str]) -> list[str]:
    head = ("pipeline", "guarantee", "rounds", *columns)
    return ["| " + " | ".join(head) + " |", "|---|---|--:|" + "--:|" * len(columns), *rows]


def _failed(results: list[Result]) -> list[str]:
    return [f"- {r.pipeline.key} failed: {r.error.splitlines()[0]}" for r in results if r.error]


def throughput_table(results: list[Result]) -> list[str]:
    rows = []
    for r in results:
        cores = r.pipeline.cores
        rows.append(
            _row(
                r,
                _spread(r, _rate),
                _spread(r, lambda x: x.whole_rate or None),
                str(cores),
                _num((r.median(_rate) or 0) / cores or None),
                _num(r.median(_records_per_cpu_second)),
                _num(r.median(_outputs_per_1000)),
                _spread(r, lambda x: x.commit_p50()),
                _spread(r, lambda x: x.startup_s, 1),
                _spread(r, lambda x: x.first_commit_s or None, 1),
            )
        )
    columns = (
        "records/s, steady",
        "records/s, whole run",
        "cores",
        "steady records/s per core",
        "records per CPU-second",
        "output records per 1,000 input",
        "commit p50 ms",
        "start-up s",
        "process start to first commit s",
    )
    return _table(columns, rows)


def _records_per_cpu_second(r: Round) -> float | None:
    used = r.cpu_us_per_record()
    return 1e6 / used if used else None


def _outputs_per_1000(r: Round) -> float | None:
    return r.outputs * 1000 / r.whole_records if r.whole_records else None


def latency_table(results: list[Result]) -> list[str]:
    rows = []
    for r in results:
        measured = sum(1 for x in r.rounds if x.latency_p50_ms is not None)
        if measured:
            p99 = _spread(r, lambda x: x.latency_p99_ms)
            rows.append(_row(r, _spread(r, _p50), p99, _spread(r, _recovery, 1), rounds=measured))
    return _table(("latency p50 ms", "latency p99 ms", "recovery s"), rows)


def memory_table(results: list[Result]) -> list[str]:
    def part(name: str) -> Figure:
        return lambda x: x.pss(name)

    def workers_rss(x: Round) -> float | None:
        return process.workers(x.rss_mb) or None

    rows = [
        _row(
            r,
            _spread(r, part("jvm")),
            _spread(r, part("driver")),
            _spread(r, part("tasks")),
            _spread(r, part("planners")),
            _spread(r, part("workers")),
            _spread(r, workers_rss),
            _spread(r, part("pipeline")),
        )
        for r in results
    ]
    columns = (
        "JVM PSS MB",
        "Python driver PSS MB",
        "task workers PSS MB",
        "Spark's driver-side Python PSS MB",
        "Python workers PSS MB (both)",
        "Python workers RSS MB",
        "whole pipeline PSS MB",
    )
    return _table(columns, rows)


def targets_table(results: list[Result], s: Settings) -> list[str]:
    """Each target's ratio and whether it is met; unjudged on a release other than the
    targets' (a run on the lowest measures what the lowest costs, not the targets)."""
    by_key = {r.pipeline.key: r for r in results}
    lines = ["| target | measured, 95% interval | met |", "|---|--:|---|"]
    for target in TARGETS:
        ratio = target.ratio(by_key)
        if ratio is None:
            lines.append(f"| {target.label} | not measured | - |")
            continue
        verdict = _verdict(target, ratio, by_key) if s.judged else _unjudged(s)
        lines.append(f"| {target.label} | {_ratio_text(ratio, target.bound)} | {verdict} |")
    return lines


def _verdict(target: Target, ratio: stats.Ratio, by_key: dict[str, Result]) -> str:
    verdict = "yes" if target.met(ratio) else "**no**"
    if ratio.straddles(target.bound):
        verdict += " (the interval holds the bound)"
    if not target.met(ratio) and target.figure is _rate:
        verdict += f": {_slowest(by_key[target.pipeline])}"
    return verdict


def _unjudged(s: Settings) -> str:
    return f"not judged: the targets are PySpark {HIGHEST}'s, this ran {s.pyspark}"


def pairs_table(results: list[Result], s: Settings) -> list[str]:
    """Each pair's records/s ratio, steady and whole run, with its interval's width; a
    run longer than the default also gives the steady ratio of its first
    :data:`~.runner.RECORDS` records (the default run's measure), side by side."""
    by_key = {r.pipeline.key: r for r in results}
    longer = s.records > RECORDS
    early_head = f" steady over the first {RECORDS:,} records |" if longer else ""
    lines = [
        f"| pair | steady, 95% interval | +- |{early_head} whole run, 95% interval | "
        f"within +-{s.precision:.0%} |",
        "|---|--:|--:|" + ("--:|" if longer else "") + "--:|---|",
    ]
    for mine, other in PAIRS:
        steady = Target("", mine, other, 1.0).ratio(by_key)
        whole = Target("", mine, other, 1.0, lambda x: x.whole_rate or None).ratio(by_key)
        if steady is None:
            continue
        width = steady.half_width
        narrow = "yes" if steady.narrower_than(s.precision) else "**no**"
        early = ""
        if longer:
            first = Target("", mine, other, 1.0, lambda x: x.early_rate).ratio(by_key)
            early = f" {first.text() if first else '-'} |"
        lines.append(
            f"| {mine} / {other} | {steady.text()} | "
            f"{'-' if width is None else f'{width:.1%}'} |{early} "
            f"{whole.text() if whole else '-'} | {narrow} |"
        )
    return lines


def _ratio_text(ratio: stats.Ratio, bound: float) -> str:
    """Two decimals, or three where two would round a miss up to the bound (0.948 is not
    0.95)."""
    text = ratio.text()
    near = f"{ratio.estimate:.2f}" == f"{bound:.2f}" and ratio.estimate != bound
    return ratio.text(3) if near else text


def _slowest(result: Result) -> str:
    typical = result.typical()
    stages = {
        k: v
        for k, v in (typical.stages_ms if typical else {}).items()
        if k != "triggerExecution" and "task ms" not in k
    }
    if not typical or not stages:
        return "see the profile"
    name, ms = max(stages.items(), key=lambda item: item[1])
    total = typical.stages_ms.get("triggerExecution", sum(stages.values()))
    return f"{ms:,.0f} of {total:,.0f} ms a batch in {name}"


def per_record_table(results: list[Result]) -> list[str]:
    """Microseconds a record, steady state: the cores' time (cores x batch time /
    records), this package's tasks' parts of it, and the CPU the pipeline used."""
    rows = []
    for r in results:
        typical = r.typical()
        if typical is None or not typical.records:
            continue
        stages = typical.stages_ms
        per_batch = typical.records / max(1, len(typical.commit_ms))

        def us(ms: float | None, per: float = per_batch) -> float | None:
            return None if ms is None else ms * 1000 / per

        core_us = r.pipeline.cores * 1e6 / typical.rate if typical.rate else None
        source = us(stages.get("source read (task ms)"))
        # A two-phase Kafka sink's tasks prepare (their steps are "sink prepare"); the
        # driver's commit is the next column.
        sink = us(stages.get("sink write (task ms)", stages.get("sink prepare (task ms)")))
        commit = us(stages.get("sink commit (part of addBatch)"))
        # Spark's rest only where this package measured both its tasks (an at-least-once
        # sink's writes are not timed, and would count as Spark's)
        rest = core_us if r.pipeline.engine == "spark" else None  # all of it Spark's
        if core_us is not None and source is not None and sink is not None:
            rest = core_us - source - sink - (commit or 0.0)
        rows.append(
            _row(
                r,
                _num(core_us, 1),
                _num(source, 1),
                _num(sink, 1),
                _num(commit, 1),
                _num(rest, 1),
                _num(typical.cpu_us_per_record(), 1),
            )
        )
    columns = (
        "core-us a record",
        "source read",
        "sink write",
        "sink commit",
        "the rest (Spark)",
        "CPU us a record",
    )
    return _table(columns, rows)


STAGES = (
    "addBatch",
    "source read (task ms)",
    "sink write (task ms)",
    "sink prepare (task ms)",
    "sink commit (part of addBatch)",
    "queryPlanning",
    "latestOffset",
    "getBatch",
    "walCommit",
    "commitOffsets",
    "triggerExecution",
)


def profile_table(results: list[Result], paced: bool = False) -> list[str]:
    """Spark's stages per batch (of the typical round): of the throughput phase, or
    (``paced``) of the latency phase's steady state, with the batch interval."""
    stages = ("batch interval", *STAGES) if paced else STAGES
    rows = []
    for r in results:
        typical = r.typical()
        measured = (typical.latency_stages_ms if paced else typical.stages_ms) if typical else {}
        if measured:
            rows.append(_row(r, *(_num(measured.get(stage)) for stage in stages)))
    return _table(stages, rows) if rows else []


def steps_table(results: list[Result]) -> list[str]:
    """Our tasks' steps ("source read: fetch (task ms)"), one column each."""
    typical = {r.pipeline.key: r.typical() for r in results}
    steps = list(dict.fromkeys(k for t in typical.values() if t for k in t.stages_ms if ": " in k))
    rows = []
    for r in results:
        t = typical[r.pipeline.key]
        if t and any(step in t.stages_ms for step in steps):
            rows.append(_row(r, *(_num(t.stages_ms.get(step)) for step in steps)))
    names = tuple(step.removesuffix(" (task ms)") for step in steps)
    return _table(names, rows) if rows else []


#: The CPU table's columns after the pipeline's and the broker's: the pipeline's parts
#: (a report before they were measured shows "-").
CPU_PARTS = (
    ("jvm", "JVM"),
    ("jvm-gc", "of it GC"),
    ("jvm-jit", "of it JIT"),
    ("tasks", "task workers"),
    ("planners", "Spark's driver-side Python"),
    ("driver", "Python driver"),
)


def _cpu_of(who: str) -> Figure:
    """A round's CPU microseconds a steady record of ``who`` (:attr:`Round.cpu_s`)."""
    return lambda r: r.cpu_us_per_record(who)


def cpu_table(results: list[Result]) -> list[str]:
    """CPU microseconds a steady record: the pipeline's processes and the broker's, then
    where in the pipeline it went (each column a median over the rounds), and the
    machine's speed probe meanwhile (median, lowest and highest round)."""
    rows = []
    for r in results:
        mine = r.median(lambda x: x.cpu_us_per_record("pipeline"))
        broker = r.median(lambda x: x.cpu_us_per_record("broker"))
        if mine is not None:
            both = None if broker is None else mine + broker
            parts = [_num(r.median(_cpu_of(who)), 1) for who, _ in CPU_PARTS]
            probe = _spread(r, lambda x: x.probe_ms, 2)
            rows.append(_row(r, _num(mine, 1), _num(broker, 1), _num(both, 1), *parts, probe))
    head = (
        "pipeline CPU us",
        "broker CPU us",
        "together",
        *(name for _, name in CPU_PARTS),
        "machine speed probe ms (lower: faster)",
    )
    return _table(head, rows) if rows else []


def machine_facts(endpoints: Endpoints) -> list[str]:
    import confluent_kafka
    import psycopg
    import pyspark
    import redis

    from eos_connectors.dev.compare.jars import CONNECTOR_VERSION
    from eos_connectors.dev.stack.kafka import KAFKA_VERSION

    with psycopg.connect(endpoints.postgres_dsn) as conn:
        row = conn.execute("SHOW server_version").fetchone()
    client = redis.Redis.from_url(endpoints.redis_url)
    redis_version = client.info("server")["redis_version"]
    client.close()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return [
        f"- CPU: {_cpu_model()}, {os.cpu_count()} cores; memory {memory:.0f} GiB; "
        f"{platform.system()} {platform.release()}",
        f"- Python {platform.python_version()}, PySpark {pyspark.__version__} (local[2], "
        f"RocksDB state store), Java {_java_version()}",
        f"- Kafka broker {KAFKA_VERSION} (one broker, loopback); confluent-kafka "
        f"{confluent_kafka.__version__}, librdkafka {confluent_kafka.libversion()[0]}",
        f"- PostgreSQL {row[0] if row else '?'}; Redis {redis_version} (appendonly, fsync always)",
        f"- Spark's Kafka connector spark-sql-kafka-0-10 {CONNECTOR_VERSION}; "
        f"Quix Streams {_quix_version()}",
    ]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _version_of(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return "?"
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0] if lines else "?"


def _java_version() -> str:
    return _version_of(["java", "-version"]).replace('"', "")


def _quix_version() -> str:
    return _version_of(
        [str(QUIX_PYTHON), "-c", "import quixstreams; print(quixstreams.__version__)"]
    )


def markdown(results: list[Result], s: Settings, facts: list[str], command: str) -> str:
    sections: list[tuple[str, list[str]]] = [
        ("Machine", facts),
        ("Settings", _settings(s)),
        ("Targets", targets_table(results, s)),
        ("Pairs: records/s ratios", pairs_table(results, s)),
        ("Throughput", throughput_table(results)),
        ("Latency and recovery", latency_table(results)),
        ("Memory (peak of the throughput phase)", memory_table(results)),
        ("Microseconds a record (the round of the median records/s)", per_record_table(results)),
        ("Spark's batch, ms (the same round)", profile_table(results)),
        ("This package's tasks, ms a batch (the same round)", steps_table(results)),
        ("CPU microseconds a record, pipeline and broker", cpu_table(results)),
        ("Spark's batch, ms (latency phase)", profile_table(results, paced=True)),
        ("Failed", _failed(results)),
    ]
    lines = [
        "# The keyed count, side by side",
        "",
        f"`{command}`; what each figure means: [docs/bench.md]({DOCS}).",
        "",
        "![throughput, latency and recovery](compare.png)",
    ]
    for heading, body in sections:
        if body:
            lines += ["", f"## {heading}", "", *body]
    return "\n".join([*lines, ""])


def _settings(s: Settings) -> list[str]:
    return [
        f"- throughput: {s.records:,} records, {s.keys:,} keys, 4 partitions, "
        f"{s.batch_records:,} a batch; steady state: the second half",
        f"- latency: {s.rate:,} records/s, 1,000 keys, {s.latency_seconds:g} s window, "
        "then SIGKILL and restart",
        f"- rounds: {s.rounds} (both phases), Quix and raw loop {s.reference_rounds}; "
        f"throughput rounds up to {s.max_rounds} until each pair is within "
        f"+-{s.precision:.0%}",
    ]


def require_matplotlib() -> None:
    """ConfigError naming the extra when matplotlib (the chart) is not installed."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ConfigError(
            "eos bench compare draws its chart with matplotlib: install the bench extra "
            "(pip install 'eos-connectors[bench]')."
        ) from None


def chart(results: list[Result], path: Path) -> None:
    require_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in results if r.rounds]
    labels = [r.pipeline.key for r in done]
    figure, axes = plt.subplots(1, 3, figsize=(15, 5.5))
    panels = [
        ("records/s, steady (higher is better)", _rate),
        ("latency p99, ms (lower is better)", lambda x: x.latency_p99_ms),
        ("recovery after SIGKILL, s (lower is better)", _recovery),
    ]
    colors = ["#1f77b4" if r.pipeline.engine == "eos" else "#999999" for r in done]
    for axis, (title, figure_of) in zip(axes, panels, strict=True):
        medians = [r.median(figure_of) or 0 for r in done]
        lows = [
            m - (stats.spread([figure_of(x) for x in r.rounds]) or (0, m, m))[1]
            for m, r in zip(medians, done, strict=True)
        ]
        highs = [
            (stats.spread([figure_of(x) for x in r.rounds]) or (0, m, m))[2] - m
            for m, r in zip(medians, done, strict=True)
        ]
        axis.barh(labels, medians, color=colors, xerr=[lows, highs], capsize=3)
        axis.set_title(title, fontsize=10)
        axis.invert_yaxis()
        axis.tick_params(labelsize=8)
    figure.suptitle("Kafka -> keyed count -> sink: median round, bars from lowest to highest")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
