"""``eos verify`` and ``eos demo``: the harness from the command line."""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from pathlib import Path

from eos_connectors.core.secrets import is_secret_option, secret_values
from eos_connectors.dev.harness.cells import CELLS, DRIVER_POINTS, TWO_PHASE_POINTS
from eos_connectors.dev.harness.plan import check_names
from eos_connectors.dev.harness.services import endpoints_and_crash
from eos_connectors.dev.harness.verify import (
    BROKER_ROLES,
    FAMILIES,
    SERVICES,
    CustomSink,
    Plan,
    Report,
    verify,
)


def add_verify_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=20_000, help="input records (default 20000)")
    parser.add_argument(
        "--cells",
        default="running-count",
        help=f"conformance cells, comma-separated: {', '.join(CELLS)} (default running-count)",
    )
    parser.add_argument(
        "--sinks",
        default=",".join(FAMILIES),
        help=f"built-in sinks of each cell, comma-separated (default {','.join(FAMILIES)}; "
        "'' for none)",
    )
    parser.add_argument(
        "--fault-rounds",
        type=int,
        default=1,
        help=f"cross each sink's fault points ({', '.join(TWO_PHASE_POINTS)}) this many times",
    )
    parser.add_argument(
        "--full-crashes",
        choices=["mixed", "all", "none"],
        default="mixed",
        help="mixed: one point (after-prepare, in a task) crashes the whole pipeline, "
        f"the others kill the process at the point ({', '.join(DRIVER_POINTS)}: the query "
        "restarts in the same session); all: every point crashes the whole pipeline; "
        "none: no point does",
    )
    parser.add_argument(
        "--coverage",
        choices=["every", "pairs"],
        default="every",
        help="every: each query crosses every point of its sink; pairs: the points of each "
        "built-in sink are spread over its queries, each (sink, point) pair crossed at least "
        "once (fewer batches: CI's budget); custom sinks cross every point either way",
    )
    parser.add_argument("--kills", type=int, default=1, help="SIGKILLs at random moments")
    parser.add_argument(
        "--restart",
        action="append",
        default=[],
        choices=SERVICES,
        help="SIGKILL this service mid-run and start it again (repeatable)",
    )
    parser.add_argument(
        "--kill-broker",
        action="append",
        default=[],
        choices=BROKER_ROLES,
        help="on a replicated Kafka (`eos stack up --kafka-brokers 3`): SIGKILL the broker "
        "with this role mid-run and start it again; no query may fail (repeatable)",
    )
    parser.add_argument(
        "--network-fault",
        action="append",
        default=[],
        metavar="SERVICE:KIND",
        help="put a TCP fault proxy (Toxiproxy) between the pipeline and SERVICE "
        "(kafka: every broker, postgres, redis) and, mid-run, reset its connections (reset), "
        "delay its answers "
        "(latency) or cut it off (cut) for a few seconds (repeatable)",
    )
    parser.add_argument(
        "--master",
        default=None,
        metavar="URL",
        help="run the pipeline on this Spark master (spark://host:port, e.g. from "
        "`eos stack up --spark-workers 2`): adds a zombie and lost executors per sink",
    )
    parser.add_argument("--words", type=int, default=40, help="distinct keys (default 40)")
    parser.add_argument(
        "--seed", type=int, default=7, help="seed of the input and the kill times (default 7)"
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=240.0,
        help="seconds without a committed batch before the run is failed",
    )
    parser.add_argument("--sink-format", default=None, help="your own sink, by format name")
    parser.add_argument(
        "--sink-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of your sink (repeatable); credentials go in --sink-options-file, "
        "since a command line is visible to every user of the machine",
    )
    parser.add_argument(
        "--sink-options-file",
        default=None,
        metavar="PATH",
        help="a JSON object of your sink's options, credentials included",
    )
    parser.add_argument(
        "--sink-register",
        default=None,
        metavar="MODULE:CLASS",
        help="the DataSource class to register for --sink-format",
    )
    parser.add_argument(
        "--sink-reader",
        default=None,
        metavar="MODULE:FUNCTION",
        help="returns the {word: count} your sink holds (needed with --sink-format)",
    )
    parser.add_argument(
        "--work-dir",
        default=None,
        help="checkpoints, run logs and report.json (default verify-runs/<id>)",
    )
    parser.add_argument(
        "--step-fault",
        action="append",
        default=[],
        metavar="NAME",
        help="crash a service at one protocol step, repeatable: coordinator (the Kafka "
        "sink's transaction coordinator, between the driver's decision and its commits; needs "
        "--kafka-brokers 3), postgres (between the decision and the COMMIT PREPAREDs), "
        "redis (between the stage and the apply), postgres-partition (the Spark driver "
        "alone cut off PostgreSQL while a batch's tasks prepare; needs --master spark://...)",
    )
    parser.add_argument(
        "--checkpoint-root",
        default=None,
        metavar="URI",
        help="keep the queries' checkpoints under this URI of a shared store Spark reaches "
        "(hdfs://..., eos stack up --hdfs gives one) instead of the work dir",
    )
    parser.add_argument("--report", default=None, help="also write the JSON report here")


def plan_from(args: argparse.Namespace) -> Plan:
    custom = None
    if args.sink_format:
        if not args.sink_reader:
            raise SystemExit("eos verify: --sink-format needs --sink-reader MODULE:FUNCTION")
        options = _sink_options(args.sink_option, args.sink_options_file)
        custom = CustomSink(args.sink_format, args.sink_reader, options, args.sink_register)
    return Plan(
        records=args.records,
        cells=tuple(c.strip() for c in args.cells.split(",") if c.strip()),
        sinks=tuple(s.strip() for s in args.sinks.split(",") if s.strip()),
        full_crashes=args.full_crashes,
        coverage=args.coverage,
        custom=custom,
        fault_rounds=args.fault_rounds,
        kills=args.kills,
        restarts=tuple(args.restart),
        broker_kills=tuple(args.kill_broker),
        network_faults=tuple(args.network_fault),
        step_faults=tuple(args.step_fault),
        words=args.words,
        master=args.master,
        seed=args.seed,
        stall_timeout=args.stall_timeout,
        work_dir=Path(args.work_dir or Path("verify-runs") / uuid.uuid4().hex[:8]),
        checkpoint_root=args.checkpoint_root,
    )


def _sink_options(given: list[str], path: str | None) -> tuple[tuple[str, str], ...]:
    """--sink-option pairs, then the file's; a credential on the command line is refused."""
    options: dict[str, str] = {}
    for pair in given:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"eos verify: --sink-option takes KEY=VALUE, got {key!r}")
        if is_secret_option(key) or secret_values({key: value}):
            raise SystemExit(
                f"eos verify: --sink-option {key} holds a credential, which `ps` would show to "
                "every user of this machine; put it in a JSON file given as --sink-options-file."
            )
        options[key] = value
    if path:
        loaded = json.loads(Path(path).read_text())
        if not isinstance(loaded, dict):
            raise SystemExit(f"eos verify: --sink-options-file {path} must hold a JSON object")
        options.update({str(k): str(v) for k, v in loaded.items()})
    return tuple(options.items())


def run_verify(args: argparse.Namespace) -> int:
    plan = plan_from(args)
    check_names(plan)  # before the stack starts for it
    endpoints, crash = endpoints_and_crash()
    report = verify(plan, endpoints, sys.stderr, crash)
    if args.report:
        Path(args.report).write_text(report.to_json())
    return print_report(report, plan)


def print_report(report: Report, plan: Plan) -> int:
    print()
    ends = [
        r.ended_by + (f" ({r.service_crashed} crashed)" if r.service_crashed else "")
        for r in report.runs
    ]
    print(f"{len(report.runs)} runs, {report.crashes} crashes: " + ", ".join(ends))
    if report.sinks:
        print(report.table())
    if report.fired or report.plan.get("schedule"):
        print(report.fault_table())
    for sink in report.sinks:
        for leftover in sink.leftovers[:10]:
            print(f"  {sink.sink}: leftover {leftover}")
    for problem in report.problems:
        print(f"PROBLEM: {problem}")
    print(f"Report: {plan.work_dir / 'report.json'}")
    verdict = "OK: nothing lost, nothing duplicated, nothing left over"
    print(verdict if report.ok else "FAILED: see the table and problems above")
    return 0 if report.ok else 1


def run_demo(args: argparse.Namespace) -> int:
    """A running word count into all three sinks, crossed at every fault point of every
    sink (each in its own query; one of them, after-prepare, crashes the whole pipeline),
    once while the source reads, and killed once at a random moment."""
    plan = Plan(
        records=args.records,
        cells=tuple(c.strip() for c in args.cells.split(",") if c.strip()),
        work_dir=Path("verify-runs") / f"demo-{uuid.uuid4().hex[:8]}",
    )
    check_names(plan)
    endpoints, crash = endpoints_and_crash()
    print(endpoints.describe(), end="", file=sys.stderr)
    return print_report(verify(plan, endpoints, sys.stderr, crash), plan)
