"""The comparison's report: a markdown table, the targets, a profile, a PNG chart."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

from eos_connectors.core.errors import ConfigError
from eos_connectors.dev.compare.pipelines import QUIX_PYTHON
from eos_connectors.dev.compare.runner import Result, Settings
from eos_connectors.dev.endpoints import Endpoints


@dataclass(frozen=True)
class Target:
    """``pipeline`` against ``baseline``: records/s at least ``bound`` times the
    baseline's (``kind`` "throughput"), p50 latency at most ``bound`` times its
    ("latency"), or recovery at most ``bound`` seconds longer ("recovery")."""

    label: str
    pipeline: str
    baseline: str
    bound: float
    kind: str = "throughput"


#: Issue 18's targets (and the JVM connector goal after 0.9x).
TARGETS = (
    Target("(1) >= 0.95x (2): Kafka", "eos-kafka", "eos-kafka-alo", 0.95),
    Target("(1) >= 0.95x (2): PostgreSQL", "eos-postgres", "eos-postgres-alo", 0.95),
    Target("(1) >= 0.95x (2): Redis", "eos-redis", "eos-redis-alo", 0.95),
    Target("(1) >= 0.9x (3): Spark's JVM Kafka connector", "eos-kafka", "spark-kafka", 0.9),
    Target("(1) >= 1.0x (3): the goal after 0.9x", "eos-kafka", "spark-kafka", 1.0),
    Target("(1) >= 2.5x (4): Quix Streams", "eos-kafka", "quix", 2.5),
    Target("(1) p50 latency <= 1.3x (3)'s", "eos-kafka", "spark-kafka", 1.3, "latency"),
    Target("(1) recovery <= (3)'s + 3 s", "eos-kafka", "spark-kafka", 3.0, "recovery"),
)
GROUPS = {"eos": "(1)", "spark": "(3)", "quix": "(4)", "raw": "(5)"}


def _group(result: Result) -> str:
    p = result.pipeline
    return "(2)" if p.engine == "eos" and p.guarantee == "at-least-once" else GROUPS[p.engine]


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def results_table(results: list[Result]) -> list[str]:
    base = next((r for r in results if r.pipeline.key == "eos-kafka" and r.rate), None)
    lines = [
        "| | pipeline | guarantee | records/s | vs eos-kafka | start-up s | latency p50 ms "
        "| latency p99 ms | commit ms p50 | recovery s | driver MB | workers MB |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in results:
        ratio = f"{r.rate / base.rate:.2f}x" if base and r.rate else "-"
        if r.error:
            lines.append(
                f"| {_group(r)} | {r.pipeline.label} | {r.pipeline.guarantee} | "
                f"failed: {r.error.splitlines()[0]} |" + " |" * 8
            )
            continue
        lines.append(
            f"| {_group(r)} | {r.pipeline.label} | {r.pipeline.guarantee} | {r.rate:,.0f} | "
            f"{ratio} | {r.startup_s:.1f} | {_num(r.latency(0.5))} | {_num(r.latency(0.99))} | "
            f"{_num(r.commit_p50())} | {_num(r.recovery_s, 1)} | {r.driver_mb:,.0f} | "
            f"{r.workers_mb:,.0f} |"
        )
    return lines


def targets_table(results: list[Result]) -> list[str]:
    by_key = {r.pipeline.key: r for r in results}
    lines = ["| target | measured | warm-up half | met |", "|---|--:|--:|---|"]
    for target in TARGETS:
        mine, other = by_key.get(target.pipeline), by_key.get(target.baseline)
        measured = _measure(target, mine, other) if mine and other else None
        if measured is None:
            lines.append(f"| {target.label} | not measured | - | - |")
            continue
        text, met = measured
        warm = _warmup_text(mine, other) if mine and other and target.kind == "throughput" else "-"
        why = _slowest(mine) if mine and target.kind == "throughput" else _LATENCY_WHY
        lines.append(f"| {target.label} | {text} | {warm} | {'yes' if met else f'**no**: {why}'} |")
    return lines


def _warmup_text(mine: Result, other: Result) -> str:
    """The same ratio over the warm-up half (not a target: shown so a reader sees how far
    warming up moves it)."""
    if not (mine.warmup_rate and other.warmup_rate):
        return "-"
    ratio, spread = paired_ratio(mine, other, warmup=True)
    return f"{ratio:.2f}x{spread}"


_LATENCY_WHY = "see the latency phase's profile below"


def _measure(target: Target, mine: Result, other: Result) -> tuple[str, bool] | None:
    """The target's figure as text and whether it is met; None when not measured."""
    if target.kind == "throughput":
        if not (mine.rate and other.rate):
            return None
        ratio, spread = paired_ratio(mine, other)
        return f"{_ratio_text(ratio, target.bound)}x{spread}", ratio >= target.bound
    if target.kind == "latency":
        ours, theirs = mine.latency(0.5), other.latency(0.5)
        if ours is None or not theirs:
            return None
        ratio = ours / theirs
        return f"{ratio:.2f}x ({ours:,.0f} vs {theirs:,.0f} ms)", ratio <= target.bound
    if mine.recovery_s is None or other.recovery_s is None:
        return None
    more = mine.recovery_s - other.recovery_s
    return (
        f"{more:+.1f} s ({mine.recovery_s:.1f} vs {other.recovery_s:.1f} s)",
        more <= target.bound,
    )


def _ratio_text(ratio: float, bound: float) -> str:
    """Two decimals, or three where two would round a miss up to the bound (0.948 is not
    0.95)."""
    text = f"{ratio:.2f}"
    return f"{ratio:.3f}" if ratio < bound and float(text) >= bound else text


def paired_ratio(mine: Result, other: Result, warmup: bool = False) -> tuple[float, str]:
    """``mine``'s records/s over ``other``'s (``warmup``: of the warm-up half): with
    several rounds, the median of the ratios within a round (the two ran minutes apart,
    not a whole run apart), and the range of those ratios as text."""
    if warmup:
        pairs = list(zip(mine.round_warmup_rates, other.round_warmup_rates, strict=False))
        single = mine.warmup_rate / other.warmup_rate
    else:
        pairs = list(zip(mine.round_rates, other.round_rates, strict=False))
        single = mine.rate / other.rate
    if len(pairs) < 2:
        return single, ""
    ratios = sorted(a / b for a, b in pairs)
    return statistics.median(ratios), f" ({ratios[0]:.2f}-{ratios[-1]:.2f} in {len(ratios)} rounds)"


def _slowest(result: Result) -> str:
    stages = {
        k: v for k, v in result.stages_ms.items() if k != "triggerExecution" and "task ms" not in k
    }
    if not stages:
        return "see the profile below"
    name, ms = max(stages.items(), key=lambda item: item[1])
    total = result.stages_ms.get("triggerExecution", sum(stages.values()))
    tasks = [f"{k} {v:,.0f}" for k, v in result.stages_ms.items() if k in STAGES and "task ms" in k]
    inside = f" ({', '.join(tasks)}, summed over tasks on 2 cores)" if tasks else ""
    return f"{result.pipeline.key} spends {ms:,.0f} of {total:,.0f} ms a batch in {name}{inside}"


STAGES = (
    "addBatch",
    "source read (task ms)",
    "sink write (task ms)",
    "sink commit (part of addBatch)",
    "queryPlanning",
    "latestOffset",
    "getBatch",
    "walCommit",
    "commitOffsets",
    "triggerExecution",
)


def profile_table(results: list[Result], paced: bool = False) -> list[str]:
    """Spark's stages per batch: of the throughput phase, or (``paced``) of the latency
    phase's steady state, with the time from one batch's commit to the next's first."""
    stages = ("batch interval", *STAGES) if paced else STAGES
    lines = [
        "| pipeline | guarantee | " + " | ".join(stages) + " |",
        "|---|---|" + "--:|" * len(stages),
    ]
    for r in results:
        measured = r.latency_stages_ms if paced else r.stages_ms
        if measured:
            cells = " | ".join(_num(measured.get(stage)) for stage in stages)
            lines.append(f"| {r.pipeline.label} | {r.pipeline.guarantee} | {cells} |")
    return lines


def steps_table(results: list[Result]) -> list[str]:
    """Our tasks' steps ("source read: fetch (task ms)"), one column each, in the
    order the connectors report them; a table only when some run measured them."""
    steps = list(dict.fromkeys(k for r in results for k in r.stages_ms if ": " in k))
    if not steps:
        return []
    names = [step.removesuffix(" (task ms)") for step in steps]
    lines = [
        "| pipeline | guarantee | " + " | ".join(names) + " |",
        "|---|---|" + "--:|" * len(steps),
    ]
    for r in results:
        if any(step in r.stages_ms for step in steps):
            cells = " | ".join(_num(r.stages_ms.get(step)) for step in steps)
            lines.append(f"| {r.pipeline.label} | {r.pipeline.guarantee} | {cells} |")
    return [
        "Inside our tasks, per step (task ms a batch, summed over the batch's tasks): "
        "client set-up and close, fetch (librdkafka's fetch, decompression and "
        "messages), to Arrow, the wait while Spark takes a batch or computes the "
        "next rows, the sink's own writes and its transaction.",
        "",
        *lines,
    ]


def cpu_table(results: list[Result]) -> list[str]:
    """CPU milliseconds per 1,000 records of the throughput phase: the pipeline's
    processes and the local broker's; a table only when some run measured them."""
    measured = [r for r in results if r.cpu_s]
    if not measured:
        return []
    lines = [
        "CPU time per 1,000 records of the throughput phase (ms, user and system): "
        "the pipeline's processes (Python driver, JVM, Python workers) and the Kafka "
        "broker, which shares the machine's cores with them. A transaction costs the "
        "broker more than a plain write: its coordinator's log, the markers, the "
        "offsets commit.",
        "",
        "| pipeline | guarantee | pipeline CPU ms | broker CPU ms | together |",
        "|---|---|--:|--:|--:|",
    ]
    for r in measured:
        mine, broker = r.cpu_ms_per_1k("pipeline"), r.cpu_ms_per_1k("broker")
        both = None if mine is None or broker is None else mine + broker
        lines.append(
            f"| {r.pipeline.label} | {r.pipeline.guarantee} | {_num(mine, 1)} | "
            f"{_num(broker, 1)} | {_num(both, 1)} |"
        )
    return [*lines, ""]


def _paced_profile(results: list[Result]) -> list[str]:
    if not any(r.latency_stages_ms for r in results):
        return []
    return [
        "The same for a batch of the latency phase (steady state before the kill, "
        "a few thousand records a batch): per-batch costs that do not shrink with "
        "the batch set the latency.",
        "",
        *profile_table(results, paced=True),
        "",
    ]


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


def markdown(results: list[Result], settings: Settings, facts: list[str], command: str) -> str:
    workload = (
        f"{settings.records:,} records of ~100 bytes over {settings.keys:,} keys in 4 "
        f"partitions, read {settings.batch_records:,} a batch; every pipeline keeps a "
        f"running count per key and publishes each changed key's count. Records/s is of "
        f"the second half of the records, after a warm-up of the first half. Latency: "
        f"{settings.rate:,} records/s onto 1,000 keys for "
        f"{settings.latency_seconds:.0f} s of steady state, then a SIGKILL and a restart."
    )
    return "\n".join(
        [
            "# The keyed count, side by side",
            "",
            f"Reproduce with `{command}` (about 30 minutes). {_runs(settings)} the ratios are "
            "what to compare, the absolute figures depend on the machine.",
            "",
            "## Machine",
            "",
            *facts,
            "",
            "## Workload",
            "",
            workload,
            "",
            "## Results",
            "",
            *results_table(results),
            "",
            "(1) this package, exactly-once; (2) the same with `deliveryGuarantee=at-least-once`; "
            "(3) Spark's JVM Kafka source and sink; (4) Quix Streams, exactly-once; (5) a "
            "hand-written confluent-kafka transactional loop.",
            "",
            "![throughput, latency and recovery](compare.png)",
            "",
            "## Targets",
            "",
            *targets_table(results),
            "",
            "## Where the time goes",
            "",
            "Mean milliseconds per batch of the throughput phase: Spark's own progress "
            "reports (`durationMs`); inside `addBatch`, the time this package's source and "
            "sink tasks spend (summed over a batch's tasks, which share 2 cores; "
            "exactly-once sinks only) and the sink's commit, measured in the connectors "
            "(`EOS_COMMIT_TIMES`). The rest of `addBatch` is Spark: the shuffle, the "
            "stateful count (RocksDB), moving rows between the JVM and Python workers.",
            "",
            *profile_table(results),
            "",
            *steps_table(results),
            "",
            *cpu_table(results),
            *_paced_profile(results),
            _definitions(),
            "",
        ]
    )


def _runs(settings: Settings) -> str:
    if settings.rounds == 1:
        return "One run;"
    return (
        f"One run, the throughput phase {settings.rounds} times per pipeline, "
        "interleaved: records/s is each pipeline's median round, a target's ratio the "
        "median of the ratios within a round;"
    )


def _definitions() -> str:
    return "\n".join(
        [
            "## What is measured",
            "",
            "- records/s: the records of the throughput phase's batches (Quix and the raw "
            "loop: commits) past its first half, divided by the time from the commit of the "
            "batch before them to the last one's. The first half is a warm-up: the JVM's JIT, "
            "the Python workers and the caches make a Spark pipeline's batches twice as fast "
            "over its first 30-40 batches, and a pipeline runs for much longer than that. "
            "The targets table shows each ratio of the warm-up half too (from the start-up "
            "batch's commit to where records/s starts), for comparison with runs before the "
            "steady state was measured.",
            "- start-up: from the start call returning to the first batch's commit (JVM, "
            "Python workers, first plans).",
            "- latency: a record's produce timestamp to the moment a reader sees its key's "
            "count include it (Kafka read_committed; PostgreSQL and Redis read every 50 ms).",
            "- commit: Spark pipelines, the sink's commit (the driver's two-phase commit, or "
            "the slowest task transaction of the Kafka sink) plus Spark's commit-log write; "
            "Quix, its checkpoint commit; the raw loop, its transaction commit.",
            "- recovery: SIGKILL of the whole process group to the restarted pipeline's first "
            "committed batch.",
            "- memory: peak resident set of the driver (the Python process and its JVM) and "
            "of the workers (Spark's Python workers), sampled every 0.25 s.",
            "- CPU: user and system time of every process of the pipeline, and of the broker "
            "when it runs on this machine, sampled every 0.25 s and interpolated to the "
            "throughput phase's measured interval; commit times and the split per batch are "
            "of the same batches.",
        ]
    )


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

    done = [r for r in results if not r.error]
    labels = [f"{_group(r)} {r.pipeline.key}" for r in done]
    figure, axes = plt.subplots(1, 3, figsize=(15, 5.5))
    panels = [
        ("records/s (higher is better)", [r.rate for r in done]),
        ("latency p99, ms (lower is better)", [r.latency(0.99) or 0 for r in done]),
        ("recovery after SIGKILL, s (lower is better)", [r.recovery_s or 0 for r in done]),
    ]
    colors = ["#1f77b4" if r.pipeline.engine == "eos" else "#999999" for r in done]
    for axis, (title, values) in zip(axes, panels, strict=True):
        axis.barh(labels, values, color=colors)
        axis.set_title(title, fontsize=10)
        axis.invert_yaxis()
        axis.tick_params(labelsize=8)
    figure.suptitle("Kafka -> keyed count -> sink, one run on one machine (blue: this package)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
