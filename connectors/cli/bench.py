"""``eos bench``: the benchmarks (development tooling; ``compare`` needs the bench extra)."""

from __future__ import annotations

import argparse
from pathlib import Path

CONNECTOR_BENCHES = {
    "source": "eos_kafka source vs a raw confluent-kafka consume loop",
    "postgres": "eos_postgres exactly-once vs at-least-once",
    "kafka": "eos_kafka sink exactly-once vs at-least-once",
    "redis": "eos_redis exactly-once vs at-least-once",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from eos_connectors.dev.compare.command import add_arguments as add_compare_arguments

    benches = parser.add_subparsers(dest="which", required=True, metavar="BENCH")
    compare = benches.add_parser(
        "compare", help="the keyed count here and in Spark's JVM connector, Quix, a raw loop"
    )
    add_compare_arguments(compare)
    benches.add_parser(
        "tasks", help="Spark's cost per Python task under each worker set-up (~2 min)"
    )
    kafka_cpu = benches.add_parser(
        "kafka-cpu",
        help="one Kafka sink task's CPU, its own and the local broker's, at-least-once "
        "against the batch and the task commit (~3 min)",
    )
    kafka_cpu.add_argument("--tasks", type=int, default=200, help="tasks per mode and round")
    kafka_cpu.add_argument("--rounds", type=int, default=3, help="rounds of each mode")
    kafka_cpu.add_argument(
        "--out", default="bench-results", help="the directory kafka-cpu.json goes to"
    )
    kafka_commit = benches.add_parser(
        "kafka-commit",
        help="the Kafka sink's driver commit step for 4, 32 and 200 tasks a batch (~1 min)",
    )
    kafka_commit.add_argument("--rounds", type=int, default=3, help="batches of each size")
    kafka_commit.add_argument(
        "--out", default="bench-results", help="the directory kafka-commit.json goes to"
    )
    for which, text in CONNECTOR_BENCHES.items():
        one = benches.add_parser(which, help=text)
        one.add_argument("--records", type=int, default=1_000_000, help="records to move")
        one.add_argument("--out", default="bench-results", help="where the results go")


def run(args: argparse.Namespace) -> int:
    if args.which == "compare":
        from eos_connectors.dev.compare.command import run_compare

        return run_compare(args)
    if args.which == "tasks":
        from eos_connectors.dev.compare.task_cost import run as run_tasks

        return run_tasks()
    if args.which == "kafka-cpu":
        return _kafka_cpu(args)
    if args.which == "kafka-commit":
        return _kafka_commit(args)
    from eos_connectors.dev.bench import run_bench

    return run_bench(args.which, records=args.records, out_dir=Path(args.out))


def _kafka_cpu(args: argparse.Namespace) -> int:
    from eos_connectors.core.errors import ConfigError
    from eos_connectors.dev.bench import bench_endpoints
    from eos_connectors.dev.compare.sink_cpu import run as run_cpu

    if args.tasks < 1 or args.rounds < 1:
        raise ConfigError(
            f"--tasks and --rounds must be 1 or more (got {args.tasks}, {args.rounds})"
        )
    run_cpu(bench_endpoints().kafka_bootstrap, args.tasks, args.rounds, Path(args.out))
    return 0


def _kafka_commit(args: argparse.Namespace) -> int:
    from eos_connectors.core.errors import ConfigError
    from eos_connectors.dev.bench import bench_endpoints
    from eos_connectors.dev.compare.kafka_commit import run as run_commit

    if args.rounds < 1:
        raise ConfigError(f"--rounds must be 1 or more (got {args.rounds})")
    run_commit(bench_endpoints().kafka_bootstrap, args.rounds, Path(args.out))
    return 0
