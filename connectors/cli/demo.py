"""``eos demo``: the main job, end to end (the harness, with the demo's defaults)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Start the local stack, write keyed records to a transactional topic (every fourth "
        "transaction aborted), run eos_kafka -> running count -> eos_kafka, eos_postgres, "
        "eos_redis as its own process, crash it at every fault point of every sink and once "
        "at a random moment, restart it until the input is processed, and count."
    )
    parser.add_argument("--records", type=int, default=10_000, help="input records (default 10000)")
    parser.add_argument(
        "--cells",
        default="running-count",
        help="conformance cells, comma-separated (default running-count; changelog: a change "
        "stream with deletes into the three sinks)",
    )


def run(args: argparse.Namespace) -> int:
    from eos_connectors.dev.harness.command import run_demo

    return run_demo(args)
