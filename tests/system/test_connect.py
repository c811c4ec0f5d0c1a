"""The pipeline over Spark Connect: nothing in the package needs a SparkContext."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from eos_connectors.dev.harness.verify import Report

pytestmark = [pytest.mark.services, pytest.mark.spark]


@pytest.mark.cost(43)
def test_a_pipeline_over_spark_connect_survives_its_crashes(
    eos_verify: Callable[..., Report],
) -> None:
    """The same pipeline on a Spark Connect session (a local Connect server behind it):
    register() and the queries use only the Connect API, and a kill of the whole
    pipeline with its Connect server at a random moment loses and duplicates nothing.
    The protocol's points are the local-mode cells' part: over Connect the commit runs
    in the server's Python process exactly as it does in a local driver."""
    report = eos_verify(
        records=2_000, master="connect", sinks=("postgres",), kills=1, fault_rounds=0
    )
    print(report.table(), report.fault_table(), sep="\n")
    assert report.ok, (report.problems, report.table(), [s.leftovers for s in report.sinks])
    assert set(report.fired) == set(report.plan["schedule"])
    assert any(r.ended_by == "kill" for r in report.runs)
