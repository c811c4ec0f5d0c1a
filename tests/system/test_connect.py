"""The pipeline over Spark Connect: nothing in the package needs a SparkContext.

The same pipeline on a Spark Connect session (a local Connect server behind it):
register() and the queries use only the Connect API, and the sink's commit runs in the
server's Python process exactly as it does in a local driver. Second tier (`make
full`): the pipeline runs to its end once (~40 s alone, 53-70 s beside CI's other tests:
a Connect server's start and the query). Over Connect the executors and the server run
the package's classic code paths, which CI crosses with every fault; what this proves is
the API path, and a break there fails the query loudly rather than lose or duplicate a
record. `make soak` also kills it with its Connect server at a random moment, which loses
and duplicates nothing (the whole-pipeline crashes themselves are the conformance run's
part).

The running-count cell's ``transformWithStateInPandas`` has no Spark Connect client
before PySpark 4.1 (SPARK-50856; 4.0's Connect ``GroupedData`` lacks the method): there
the pipeline is the aggregate cell's count in complete mode, which every release's
Connect offers.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from eos_connectors.core.spark_api import SPARK_MINOR
from eos_connectors.dev.harness.verify import Report

pytestmark = [pytest.mark.services, pytest.mark.spark, pytest.mark.full]

#: The stateful stage a Connect client of this release offers.
CELL = "running-count" if SPARK_MINOR >= (4, 1) else "aggregate"


@pytest.mark.parametrize(
    "kills",
    [pytest.param(0, marks=pytest.mark.cost(40)), pytest.param(1, marks=pytest.mark.soak)],
)
def test_a_pipeline_over_spark_connect_writes_each_record_once(
    eos_verify: Callable[..., Report], kills: int
) -> None:
    report = eos_verify(
        records=2_000,
        master="connect",
        cells=(CELL,),
        sinks=("postgres",),
        kills=kills,
        fault_rounds=0,
    )
    print(report.table(), report.fault_table(), sep="\n")
    assert report.ok, (report.problems, report.table(), [s.leftovers for s in report.sinks])
    assert set(report.fired) == set(report.plan["schedule"])
    assert any(r.ended_by == "kill" for r in report.runs) == bool(kills)
