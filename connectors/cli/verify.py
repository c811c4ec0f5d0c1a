"""``eos verify``: the exactly-once harness (see ``eos_connectors.dev.harness``)."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from eos_connectors.dev.harness.command import add_verify_arguments

    add_verify_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from eos_connectors.dev.harness.command import run_verify

    return run_verify(args)
