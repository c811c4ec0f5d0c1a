"""The harness as a pytest fixture, for this package's tests and a connector author's.

Enable it with ``pytest_plugins = ["eos_connectors.dev.harness.pytest_plugin"]`` in a
conftest, then::

    def test_my_sink_is_exactly_once(eos_verify):
        report = eos_verify(sinks=(), custom=CustomSink("my_sink", "my_pkg.check:counts",
                            (("url", "..."),), "my_pkg.sink:MySinkSource"))
        assert report.ok, report.problems or report.table()

Each fault point of your sink fires in its own query (``rc-custom``); the report's
``fault_table()`` says where each fired. Prove the protocol steps first, without
Spark, with ``eos_connectors.testing.SinkContract``.

The services come from the ``EOS_*`` variables, else the package's stack.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eos_connectors.dev.harness.services import endpoints_and_crash
from eos_connectors.dev.harness.verify import Plan, Report, verify


@pytest.fixture
def eos_verify(tmp_path: Path) -> Callable[..., Report]:
    """``eos_verify(**plan fields)`` runs the harness and returns its report."""
    return harness_runner(tmp_path)


def harness_runner(tmp_path: Path) -> Callable[..., Report]:
    """What the fixture returns, for a conftest that wraps it (say, to make the
    services its own session fixture's, so the session stops them)."""

    def run(**fields: Any) -> Report:
        endpoints, crash = endpoints_and_crash()
        plan = Plan(**{"work_dir": tmp_path / "verify", **fields})
        return verify(plan, endpoints, sys.stderr, crash)

    return run
