"""The ``eos`` command: one module per command, imported only when that command runs.

``eos --help`` and ``eos --version`` import nothing but this module and the package's
version: a command's own module (and what it needs, say the harness for ``eos
verify``) is imported once its name is known, to add its arguments and run it. So a
command's tooling, or an extra it needs, never stands in the way of the others.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol

from eos_connectors._version import __version__


class Command(Protocol):
    """What each ``eos_connectors.cli.<command>`` module provides."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


#: command -> (module under eos_connectors.cli, one line of help)
COMMANDS: dict[str, tuple[str, str]] = {
    "stack": ("stack", "start, stop and show the local Kafka, PostgreSQL and Redis services"),
    "demo": (
        "demo",
        "a word count into Kafka, PostgreSQL and Redis, crashed at every fault point, counted",
    ),
    "verify": ("verify", "crash a pipeline at every fault point, then count what each sink holds"),
    "sinks": ("sinks", "sink ids in PostgreSQL, Redis and Kafka: list, show, settle, reset"),
    "checkpoint": ("checkpoint", "inspect a streaming query's checkpoint, rescale its state"),
    "savepoint": (
        "savepoint",
        "named copies of a stopped query's checkpoint: create, list, restore",
    ),
    "state": ("state", "read a stopped query's keyed state (or a savepoint's) as rows"),
    "bench": ("bench", "benchmarks: the connectors against their baselines, ratios from one run"),
}


def _top_parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<11} {text}" for name, (_m, text) in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="eos",
        description="Exactly-once connectors for PySpark: the tools around them.",
        epilog=f"commands:\n{listing}\n\n`eos COMMAND --help` explains a command.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"eos-connectors {__version__}")
    parser.add_argument("command", choices=COMMANDS, metavar="COMMAND", help="see below")
    return parser


def command_parser(name: str) -> tuple[argparse.ArgumentParser, Command]:
    """The parser of one command, with its arguments, and its module."""
    module_name, text = COMMANDS[name]
    module: Command = importlib.import_module(f"eos_connectors.cli.{module_name}")  # type: ignore[assignment]
    parser = argparse.ArgumentParser(prog=f"eos {name}", description=text)
    module.add_arguments(parser)
    _finish_subcommands(parser)
    return parser, module


def _finish_subcommands(parser: argparse.ArgumentParser) -> None:
    """A command's own options (``--dir``, the store options) are taken after its
    subcommand too (``eos savepoint list --dir X`` as ``eos savepoint --dir X list``), and
    each subcommand's ``--help`` opens with its one line of help."""
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        return
    shared = [
        a
        for a in parser._actions
        if a.option_strings and not isinstance(a, (argparse._HelpAction, argparse._VersionAction))
    ]
    helps = {c.dest: c.help for c in subcommands[0]._choices_actions}
    for name, sub in subcommands[0].choices.items():
        if sub.description is None:
            sub.description = helps.get(name)
        for action in shared:
            if any(o in sub._option_string_actions for o in action.option_strings):
                continue
            again = copy.copy(action)
            again.default = argparse.SUPPRESS  # the command's default stays when not given
            sub._add_action(again)


def main(argv: Sequence[str] | None = None) -> int:
    from eos_connectors.core.errors import EosError

    given = list(sys.argv[1:] if argv is None else argv)
    if not given or given[0] not in COMMANDS:  # --help, --version, or a mistake
        _top_parser().parse_args(given[:1])
        return 2
    parser, module = command_parser(given[0])
    args = parser.parse_args(given[1:])
    try:
        return module.run(args)
    except EosError as exc:
        print(f"eos: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
