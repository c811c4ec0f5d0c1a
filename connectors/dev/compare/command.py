"""``eos bench compare``: every pipeline of ``pipelines.PIPELINES`` through both phases."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from eos_connectors.core.errors import ConfigError
from eos_connectors.dev.compare import pipelines as pl
from eos_connectors.dev.compare import report, runner

QUIX_VERSION = "3.28.1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--records",
        type=int,
        default=4_000_000,
        help="throughput phase; records/s is measured over the second half",
    )
    parser.add_argument(
        "--batch-records",
        type=int,
        default=runner.BATCH_RECORDS,
        help="throughput phase: records a batch (Spark's maxOffsetsPerTrigger)",
    )
    parser.add_argument(
        "--keys", type=int, default=10_000, help="distinct keys of the input (default 10000)"
    )
    parser.add_argument("--rate", type=int, default=5_000, help="latency phase, records/s")
    parser.add_argument(
        "--latency-seconds",
        type=float,
        default=15.0,
        help="steady state before the kill of the latency and recovery phase; 0 skips the phase",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="throughput rounds per pipeline, interleaved; medians reported (the first "
        "pipelines of a run's first minutes ran 10-20%% slower: one round let the order "
        "decide a ratio)",
    )
    parser.add_argument(
        "--pipelines",
        default=",".join(pl.BY_KEY),
        help=f"comma-separated, from: {', '.join(pl.BY_KEY)}",
    )
    parser.add_argument(
        "--report-dir",
        default="bench-results",
        help="where compare.md, compare.png and compare.json go (default bench-results)",
    )
    parser.add_argument("--out", default="bench-results", help="compare.json")


def _chosen(names: str) -> list[pl.Pipeline]:
    keys = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [key for key in keys if key not in pl.BY_KEY]
    if unknown or not keys:
        raise ConfigError(
            f"--pipelines: unknown {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(pl.BY_KEY)}"
        )
    return [pl.BY_KEY[key] for key in dict.fromkeys(keys)]


def ensure_quix() -> None:
    """Quix Streams in a virtualenv of its own (it pins an older confluent-kafka)."""
    from eos_connectors.dev.stack.process import run

    python = pl.QUIX_PYTHON
    if python.exists():
        return
    venv = python.parent.parent
    run([sys.executable, "-m", "venv", str(venv)], what=f"Creating {venv}")
    run(
        [str(python), "-m", "pip", "install", "-q", f"quixstreams=={QUIX_VERSION}"],
        what=f"Installing Quix Streams {QUIX_VERSION} into {venv}",
    )


def run_compare(args: argparse.Namespace) -> int:
    from eos_connectors.dev.bench import bench_endpoints, fill_topic
    from eos_connectors.dev.compare.jars import spark_kafka_jars

    report.require_matplotlib()  # the chart comes at the end of a run: fail now, not then
    chosen = _chosen(args.pipelines)
    if args.rounds < 1 or args.latency_seconds < 0 or args.batch_records < 1:
        raise ConfigError(
            f"--rounds and --batch-records must be 1 or more (got {args.rounds}, "
            f"{args.batch_records}), --latency-seconds 0 or more (got "
            f"{args.latency_seconds:g})"
        )
    if any(p.engine == "quix" for p in chosen):
        ensure_quix()
    if any(p.engine == "spark" for p in chosen):
        spark_kafka_jars()
    endpoints = bench_endpoints()
    settings = runner.Settings(
        args.records,
        args.keys,
        args.rate,
        args.latency_seconds,
        runner.work_dir(),
        args.rounds,
        args.batch_records,
    )
    topic = f"eos-bench-compare-{uuid.uuid4().hex[:8]}"
    print(f"Writing {args.records:,} records of ~100 bytes over {args.keys:,} keys to {topic}...")
    fill_topic(endpoints.kafka_bootstrap, topic, args.records, args.keys)
    began = time.monotonic()
    results = runner.run_all(chosen, topic, endpoints, settings)
    command = _command(args)
    text = report.markdown(results, settings, report.machine_facts(endpoints), command)
    out = Path(args.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(text)
    report.chart(results, out / "compare.png")
    _write_json(Path(args.out) / "compare.json", results, settings)
    print("\n".join(report.results_table(results)))
    print("\n".join(report.targets_table(results)))
    print(
        f"{len(results)} pipelines in {time.monotonic() - began:.0f} s; "
        f"report: {out / 'compare.md'}, chart: {out / 'compare.png'}"
    )
    return 1 if any(r.error for r in results) else 0


def _command(args: argparse.Namespace) -> str:
    """The command that reproduces this run: ``make bench`` when it ran the defaults."""
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    argv = _command_argv(args)
    if argv == _command_argv(defaults.parse_args([])):
        return "make bench"
    return shlex.join(["eos", "bench", "compare", *argv])


def _command_argv(args: argparse.Namespace) -> list[str]:
    return [
        "--records",
        str(args.records),
        "--batch-records",
        str(args.batch_records),
        "--keys",
        str(args.keys),
        "--rate",
        str(args.rate),
        "--latency-seconds",
        f"{args.latency_seconds:g}",
        "--pipelines",
        args.pipelines,
        "--rounds",
        str(args.rounds),
    ]


def _write_json(path: Path, results: list[runner.Result], settings: runner.Settings) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    for r in results:
        row = asdict(r) | {
            "rate": r.rate,
            "latency_p50_ms": r.latency(0.5),
            "latency_p99_ms": r.latency(0.99),
            "commit_p50_ms": r.commit_p50(),
        }
        row.pop("latencies_ms")
        rows.append(row)
    path.write_text(
        json.dumps({"settings": asdict(settings), "results": rows}, indent=2, default=str)
    )
