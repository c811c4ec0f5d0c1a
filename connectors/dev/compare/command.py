"""``eos bench compare``: every pipeline of ``pipelines.PIPELINES`` through both phases."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import sys
import time
import uuid
from dataclasses import asdict, fields
from pathlib import Path

import pyspark

from eos_connectors.core.errors import ConfigError
from eos_connectors.dev.compare import pipelines as pl
from eos_connectors.dev.compare import report, runner, schedule
from eos_connectors.dev.release_venv import HIGHEST

QUIX_VERSION = "3.28.1"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--records",
        type=int,
        default=runner.RECORDS,
        help=(
            f"throughput phase (default {runner.RECORDS}); steady records/s is of the "
            f"second half (a longer run also gives that of its first {runner.RECORDS})"
        ),
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
        default=10.0,
        help="the latency window before the kill of the latency and recovery phase "
        "(default 10); 0 skips the phase",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds in which every pipeline runs both phases (default 3); a round runs "
        "the pipelines forwards when odd and backwards when even, each pair side by side",
    )
    parser.add_argument(
        "--max-rounds",
        type=int,
        default=8,
        help="past --rounds, the throughput phase of each pair whose ratio's 95%% "
        "interval is wider than --precision runs again, up to this many rounds (default 8)",
    )
    parser.add_argument(
        "--precision",
        type=float,
        default=0.03,
        help="a pair's ratio is known well enough when its 95%% interval is within "
        "+- this share (default 0.03)",
    )
    parser.add_argument(
        "--reference-rounds",
        type=int,
        default=2,
        help="rounds of Quix and the raw loop, shown for reference (default 2)",
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
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="run nothing: compute compare.md and compare.png again from --report-dir's "
        "compare.json",
    )


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
    from eos_connectors.dev.warm_up import ensure_class_archive

    report.require_matplotlib()  # the chart comes at the end of a run: fail now, not then
    if args.report_only:
        return report_only(args)
    chosen = _chosen(args.pipelines)
    settings = _settings(args)
    if not settings.judged:
        print(
            f"PySpark {settings.pyspark} runs this comparison; its targets are PySpark "
            f"{HIGHEST}'s (make bench runs there), so the report shows them unjudged"
        )
    if any(p.engine == "quix" for p in chosen):
        ensure_quix()
    if any(p.spark for p in chosen):
        spark_kafka_jars()
        ensure_class_archive()  # every Spark pipeline starts with the same JVM settings
    endpoints = bench_endpoints()
    topic = f"eos-bench-compare-{uuid.uuid4().hex[:8]}"
    print(f"Writing {args.records:,} records of ~100 bytes over {args.keys:,} keys to {topic}...")
    fill_topic(endpoints.kafka_bootstrap, topic, args.records, args.keys)
    began = time.monotonic()
    results = schedule.run_all(chosen, topic, endpoints, settings)
    facts, command = report.machine_facts(endpoints), _command(args, settings)
    out = Path(args.report_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compare.md").write_text(report.markdown(results, settings, facts, command))
    report.chart(results, out / "compare.png")
    write_json(out / "compare.json", results, settings, facts, command)
    print("\n".join(report.targets_table(results, settings)))
    print("\n".join(report.pairs_table(results, settings)))
    print(
        f"{len(results)} pipelines in {time.monotonic() - began:.0f} s; "
        f"report: {out / 'compare.md'}, chart: {out / 'compare.png'}"
    )
    failed = any(r.error for r in results)
    tidy(settings.work_dir, failed)
    return 1 if failed else 0


def tidy(work: Path, failed: bool) -> None:
    """Remove the run's pipeline folders (checkpoints, logs, and specs that hold the
    stack's credentials) once every pipeline ran; keep them for their logs when one
    failed (its error names its log there)."""
    if failed:
        print(f"the pipelines' folders, with their logs, are kept in {work}")
        return
    shutil.rmtree(work, ignore_errors=True)


def _settings(args: argparse.Namespace) -> runner.Settings:
    problems = [
        message
        for broken, message in (
            (args.rounds < 1, f"--rounds must be 1 or more (got {args.rounds})"),
            (
                args.rounds > args.max_rounds,
                f"--rounds must be at most --max-rounds (got {args.rounds} > {args.max_rounds})",
            ),
            (
                args.batch_records < 1,
                f"--batch-records must be 1 or more (got {args.batch_records})",
            ),
            (
                args.latency_seconds < 0,
                f"--latency-seconds must be 0 or more (got {args.latency_seconds:g})",
            ),
            (
                not 0 < args.precision < 1,
                f"--precision must be between 0 and 1 (got {args.precision:g})",
            ),
            (
                args.reference_rounds < 1,
                f"--reference-rounds must be 1 or more (got {args.reference_rounds})",
            ),
        )
        if broken
    ]
    if problems:
        raise ConfigError("; ".join(problems))
    return runner.Settings(
        args.records,
        args.keys,
        args.rate,
        args.latency_seconds,
        runner.work_dir(),
        args.rounds,
        args.batch_records,
        args.max_rounds,
        args.reference_rounds,
        args.precision,
        pyspark.__version__,
    )


def _command(args: argparse.Namespace, settings: runner.Settings) -> str:
    """The command that reproduces this run: ``make bench`` when it ran the defaults on
    the targets' release."""
    defaults = argparse.ArgumentParser()
    add_arguments(defaults)
    argv = _command_argv(args)
    if argv == _command_argv(defaults.parse_args([])) and settings.judged:
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
        "--max-rounds",
        str(args.max_rounds),
        "--precision",
        f"{args.precision:g}",
        "--reference-rounds",
        str(args.reference_rounds),
    ]


def write_json(
    path: Path,
    results: list[runner.Result],
    settings: runner.Settings,
    facts: list[str],
    command: str,
) -> None:
    """Every round of every pipeline, as measured, with the machine and the command: the
    report is computed from these alone (``--report-only``)."""
    rows = [asdict(r) | {"rounds": [asdict(x) | _derived(x) for x in r.rounds]} for r in results]
    document = {"command": command, "machine": facts, "settings": asdict(settings)}
    path.write_text(json.dumps(document | {"results": rows}, indent=2, default=str))


def read_json(
    path: Path,
) -> tuple[list[runner.Result], runner.Settings, list[str] | None, str | None]:
    """What :func:`write_json` wrote: results, settings, the machine and the command (None
    for a file written before they were kept)."""
    document = json.loads(path.read_text())
    names = {f.name for f in fields(runner.Round)}
    results = [
        runner.Result(
            pl.BY_KEY[row["pipeline"]["key"]],
            [runner.Round(**{k: v for k, v in x.items() if k in names}) for x in row["rounds"]],
            row["error"],
        )
        for row in document["results"]
    ]
    settings = runner.Settings(**document["settings"] | {"work_dir": Path()})
    return results, settings, document.get("machine"), document.get("command")


def report_only(args: argparse.Namespace) -> int:
    """Driver: the report and chart of ``--report-dir``'s compare.json, computed again."""
    out = Path(args.report_dir)
    results, settings, facts, command = read_json(out / "compare.json")
    if facts is None:  # a file of an earlier version: this machine's facts, said so
        from eos_connectors.dev.bench import bench_endpoints

        facts = [*report.machine_facts(bench_endpoints()), "- (read when the report was redone)"]
    text = report.markdown(results, settings, facts, command or _command(args, settings))
    (out / "compare.md").write_text(text)
    report.chart(results, out / "compare.png")
    print(f"report: {out / 'compare.md'}, chart: {out / 'compare.png'}")
    return 0


def _derived(x: runner.Round) -> dict[str, float | None]:
    return {"rate": x.rate, "whole_rate": x.whole_rate, "commit_p50_ms": x.commit_p50()}
