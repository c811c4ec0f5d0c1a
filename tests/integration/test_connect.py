"""The pipeline over Spark Connect: nothing in the package needs a SparkContext."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from connectors.harness.verify import Report

pytestmark = [pytest.mark.services, pytest.mark.spark]


def test_a_pipeline_over_spark_connect_survives_its_crashes(
    eos_verify: Callable[..., Report],
) -> None:
    """The same pipeline on a Spark Connect session (a local Connect server behind it):
    register() and the queries use only the Connect API, and a crash at each point of
    the PostgreSQL sink (its process killed: the Connect server's Python worker or
    commit process; the pipeline restarts the query in the same Connect session) plus a
    kill of the whole pipeline and its Connect server lose and duplicate nothing.
    Whole-pipeline crashes at protocol points are the local-mode cells' part."""
    report = eos_verify(records=2_000, master="connect", sinks=("postgres",), kills=1,
                        full_crashes="none")  # fmt: skip
    print(report.table(), report.fault_table(), sep="\n")
    assert report.ok, (report.problems, report.table(), [s.leftovers for s in report.sinks])
    assert set(report.fired) == set(report.plan["schedule"])
    assert any(r.ended_by == "kill" for r in report.runs)
