"""The ``eos`` command's parsing: a command's options after its subcommand, and each
subcommand's help. Cost: well under a second."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from eos_connectors.cli import COMMANDS, command_parser


def test_a_commands_options_are_taken_before_or_after_its_subcommand() -> None:
    parser, _ = command_parser("savepoint")
    assert parser.parse_args(["list", "--dir", "/sp"]).dir == "/sp"
    assert parser.parse_args(["--dir", "/sp", "list"]).dir == "/sp"
    assert parser.parse_args(["list"]).dir is None
    restore = parser.parse_args(["restore", "p1", "--to", "/new", "--bookkeeping-schema", "bk"])
    assert (restore.name, restore.to, restore.bookkeeping_schema) == ("p1", "/new", "bk")
    assert parser.parse_args(["--bookkeeping-schema", "bk", "list"]).bookkeeping_schema == "bk"


def test_every_subcommands_help_says_what_it_does() -> None:
    for name in COMMANDS:
        parser, _ = command_parser(name)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    assert sub.description, f"eos {name} {sub_name} --help has no description"


def test_a_bad_cell_or_sink_is_refused_before_the_stack_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from eos_connectors.dev.harness import command
    from eos_connectors.dev.harness.plan import VerifyError

    def started() -> None:
        raise AssertionError("the stack was started for a plan that names nothing real")

    monkeypatch.setattr(command, "endpoints_and_crash", started)
    parser, _ = command_parser("verify")
    with pytest.raises(VerifyError, match="Unknown cell 'bogus'"):
        command.run_verify(parser.parse_args(["--cells", "bogus"]))
    with pytest.raises(VerifyError, match="Unknown sink 'mysql'"):
        command.run_verify(parser.parse_args(["--sinks", "mysql"]))


def test_verifys_work_dir_is_absolute_for_the_clusters_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault markers' directory (under the work dir) goes to every Python worker; on a
    standalone cluster each executor runs in a folder of its own, so the default
    ``verify-runs/<id>`` named a different directory per executor: a planned pause fired
    again in every executor Spark retried its task on, until the query failed, and the
    harness saw none fire."""
    from eos_connectors.dev.harness.command import plan_from

    monkeypatch.chdir(tmp_path)
    parser, _ = command_parser("verify")
    for given in ([], ["--work-dir", "runs/here"]):
        plan = plan_from(parser.parse_args(["--master", "spark://127.0.0.1:7077", *given]))
        assert plan.work_dir.is_absolute() and plan.work_dir.is_relative_to(tmp_path)
        assert Path(plan.checkpoints).is_absolute()


def test_the_running_count_over_connect_is_refused_below_4_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PySpark 4.0's Connect client has no transformWithStateInPandas: said before
    anything starts, with the cells that run there."""
    from eos_connectors.core import spark_api
    from eos_connectors.dev.harness.plan import Plan, VerifyError, check_names

    monkeypatch.setattr(spark_api, "SPARK_MINOR", (4, 0))
    with pytest.raises(VerifyError, match=r"from PySpark 4\.1.*--cells aggregate"):
        check_names(Plan(master="connect"))
    check_names(Plan(master="connect", cells=("aggregate",)))
    check_names(Plan(cells=("running-count",)))  # a classic session
    monkeypatch.setattr(spark_api, "SPARK_MINOR", (4, 1))
    check_names(Plan(master="connect"))
