"""The ``eos`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from connectors.errors import EosError


def _stack_command(args: argparse.Namespace) -> int:
    from connectors.stack import Stack

    stack = Stack()
    if args.action == "up":
        endpoints = stack.up()
        print(f"Stack up under {stack.root}:\n{endpoints.describe()}", end="")
        if args.spark_workers:
            master = stack.up_spark(args.spark_workers)
            print(f"Spark      {master} ({args.spark_workers} workers, one core each)")
        print('Use `eval "$(eos stack env)"` to export the endpoints.')
    elif args.action == "down":
        stopped = stack.down()
        print("Stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
    elif args.action == "status":
        for status in stack.status():
            state = f"running (pid {status.pid})" if status.running else "stopped"
            print(f"{status.name:<9} {state}")
        return 0 if stack.is_up() else 3
    elif args.action == "env":
        print(stack.endpoints().exports(), end="")
        running = stack.spark_master()
        if running:
            print(f"export EOS_SPARK_MASTER={running}")
    elif args.action == "restart":
        record = stack.restart(args.service)
        print(f"{record.name} restarted (pid {record.pid})")
    return 0


def _demo_command(args: argparse.Namespace) -> int:
    from connectors.harness.command import run_demo

    return run_demo(args)


def _verify_command(args: argparse.Namespace) -> int:
    from connectors.harness.command import run_verify

    return run_verify(args)


def _bench_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from connectors.bench import run_bench

    return run_bench(args.which, records=args.records, out_dir=Path(args.out))


def _tasks_command(args: argparse.Namespace) -> int:
    from connectors.compare.task_cost import run

    return run()


def _kafka_cpu_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from connectors.bench import _endpoints
    from connectors.compare.sink_cpu import run
    from connectors.errors import ConfigError

    if args.tasks < 1 or args.rounds < 1:
        raise ConfigError(f"--tasks and --rounds must be 1 or more (got {args.tasks}, "
                          f"{args.rounds})")  # fmt: skip
    run(_endpoints().kafka_bootstrap, args.tasks, args.rounds, Path(args.out))
    return 0


def _compare_command(args: argparse.Namespace) -> int:
    from connectors.compare.command import run_compare

    return run_compare(args)


def _sinks_command(args: argparse.Namespace) -> int:
    from connectors.sinks_command import run

    return run(args)


def _checkpoint_command(args: argparse.Namespace) -> int:
    from connectors.checkpoint_command import run_checkpoint

    return run_checkpoint(args)


def _savepoint_command(args: argparse.Namespace) -> int:
    from connectors.checkpoint_command import run_savepoint

    return run_savepoint(args)


def _state_command(args: argparse.Namespace) -> int:
    from connectors.checkpoint_command import run_state

    return run_state(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eos", description="Exactly-once connectors for PySpark")
    commands = parser.add_subparsers(dest="command", required=True)

    stack = commands.add_parser("stack", help="the local Kafka/PostgreSQL/Redis stack")
    stack_actions = stack.add_subparsers(dest="action", required=True)
    up = stack_actions.add_parser("up", help="start the services (reuses running ones)")
    up.add_argument(
        "--spark-workers", type=int, default=0, metavar="N",
        help="also start a Spark standalone master and N one-core workers on loopback",
    )  # fmt: skip
    for action, text in [
        ("down", "stop the services (and the Spark cluster) the stack started"),
        ("status", "show which services run (exit 3 unless all do)"),
        ("env", "print EOS_* endpoint exports for a shell"),
    ]:
        stack_actions.add_parser(action, help=text)
    restart = stack_actions.add_parser("restart", help="restart one service on the same port")
    restart.add_argument("service", choices=["kafka", "postgres", "redis"])
    stack.set_defaults(func=_stack_command)

    demo = commands.add_parser(
        "demo",
        help="running word count into Kafka, PostgreSQL and Redis, crashed at every fault "
        "point of every sink and killed once, then counted",
    )
    demo.add_argument("--records", type=int, default=10_000)
    demo.set_defaults(func=_demo_command)

    from connectors.harness.command import add_verify_arguments

    verify = commands.add_parser(
        "verify", help="crash a pipeline at every fault point, then count what each sink holds"
    )
    add_verify_arguments(verify)
    verify.set_defaults(func=_verify_command)

    from connectors import sinks_command

    sinks = commands.add_parser(
        "sinks", help="sink ids in PostgreSQL, Redis and Kafka: list, show, settle, reset"
    )
    sinks_command.add_arguments(sinks)
    sinks.set_defaults(func=_sinks_command)

    from connectors import checkpoint_command

    checkpoint = commands.add_parser("checkpoint", help="inspect a streaming query's checkpoint")
    checkpoint_command.add_checkpoint_arguments(checkpoint)
    checkpoint.set_defaults(func=_checkpoint_command)
    savepoint = commands.add_parser(
        "savepoint", help="named copies of a stopped query's checkpoint: create, list, restore"
    )
    checkpoint_command.add_savepoint_arguments(savepoint)
    savepoint.set_defaults(func=_savepoint_command)
    state = commands.add_parser(
        "state", help="read a stopped query's keyed state (or a savepoint's) as rows"
    )
    checkpoint_command.add_state_arguments(state)
    state.set_defaults(func=_state_command)

    from connectors.compare.command import add_arguments

    bench = commands.add_parser("bench", help="benchmarks; ratios from one run")
    benches = bench.add_subparsers(dest="which", required=True)
    compare = benches.add_parser(
        "compare", help="the keyed count here and in Spark's JVM connector, Quix, a raw loop"
    )
    add_arguments(compare)
    compare.set_defaults(func=_compare_command)
    tasks = benches.add_parser(
        "tasks", help="Spark's cost per Python task under each worker set-up (~2 min)"
    )
    tasks.set_defaults(func=_tasks_command)
    kafka_cpu = benches.add_parser(
        "kafka-cpu",
        help="one Kafka sink task's CPU, its own and the local broker's, at-least-once "
        "against exactly-once (~2 min)",
    )
    kafka_cpu.add_argument("--tasks", type=int, default=200, help="tasks per mode and round")
    kafka_cpu.add_argument("--rounds", type=int, default=3)
    kafka_cpu.add_argument("--out", default="bench-results", help="kafka-cpu.json")
    kafka_cpu.set_defaults(func=_kafka_cpu_command)
    for which, text in [
        ("source", "eos_kafka source vs a raw confluent-kafka consume loop"),
        ("postgres", "eos_postgres exactly-once vs at-least-once"),
        ("kafka", "eos_kafka sink exactly-once vs at-least-once"),
        ("redis", "eos_redis exactly-once vs at-least-once"),
    ]:
        one = benches.add_parser(which, help=text)
        one.add_argument("--records", type=int, default=1_000_000)
        one.add_argument("--out", default="bench-results")
        one.set_defaults(func=_bench_command)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.func(args)
        return code
    except EosError as exc:
        print(f"eos: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
