"""Exactly once on a real Spark standalone cluster (a master and two one-core workers on
loopback), with executors killed and zombie task attempts.

The running-count cell (a shuffle before every sink, so a lost executor loses shuffle
files and Spark resubmits the stage) runs on the cluster. Each sink's query gets:

* a zombie: at ``before-prepare`` a task's Python worker stops, kills its own
  executor JVM and waits; Spark re-runs the task on the other executor and commits
  the batch; then the harness resumes the zombie, which prepares its unit after
  the batch was decided (it must leave nothing visible and nothing in doubt);
* an executor SIGKILLed while a task writes (``mid-prepare``) and after it
  prepared (``after-prepare``; the Kafka sink's ``after-commit`` too, its commit runs
  in the task).

The records cell's query (no shuffle: the source's split is the Kafka sink's task
partitions) also crashes whole after a task committed, and restarts with another
``minPartitions`` each time, among lost executors and a zombie of its own.

The running-count run also cuts the driver alone off PostgreSQL for 8 s once a task of
a batch has prepared (``--step-fault postgres-partition``: the driver reaches PostgreSQL
through a proxy of its own, the executors' tasks through theirs): the batch's tasks
finish, the driver cannot claim the sink id, asks again until the partition ends, and
the query goes on without failing.

The driver's points and other whole-pipeline crashes are left to the local-mode cells
(tests/integration/test_conformance.py): the driver is one local process on a cluster
too, so there they prove nothing more and cost a query restart or a new application.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eos_connectors.core.faults import Entry
from eos_connectors.dev.harness.network import DRIVER_ADDRESS
from eos_connectors.dev.harness.verify import Report
from eos_connectors.ops.locations import location

pytestmark = [pytest.mark.services, pytest.mark.spark, pytest.mark.cluster]


#: The sinks each cell writes on the cluster.
CELL_SINKS = {
    "running-count": {"rc-kafka", "rc-postgres", "rc-redis-increment"},
    "records": {"rec-kafka-records"},
}


@pytest.mark.parametrize(
    "cells",
    [
        pytest.param(("running-count",), id="running-count"),
        # CI's budget: the records cell's minPartitions changes are proven in local mode
        # (test_operator_actions, test_conformance); on the cluster in make soak.
        pytest.param(("running-count", "records"), id="both", marks=pytest.mark.soak),
    ],
)
def test_zombies_and_lost_executors_on_a_cluster_lose_and_duplicate_nothing(
    spark_master: str, eos_verify: Callable[..., Report], cells: tuple[str, ...]
) -> None:
    report = eos_verify(
        records=3_000,
        master=spark_master,
        kills=0,
        full_crashes="none",
        cells=cells,
        step_faults=("postgres-partition",),
    )
    print(report.table(), report.fault_table(), sep="\n")
    assert report.ok, (report.problems, report.table(), [s.leftovers for s in report.sinks])
    expected = set().union(*(CELL_SINKS[c] for c in cells))
    assert {s.sink for s in report.sinks} == expected

    schedule = report.plan["schedule"]
    assert set(report.fired) == set(schedule), "a planned fault point never fired"
    for entry, where in report.fired.items():
        assert where["query"] == Entry.parse(entry).query, f"{entry} fired in {where}"
    zombies = [e for e in schedule if Entry.parse(e).action == "pause"]
    assert len(zombies) == len(expected), zombies  # one per sink
    markers = Path(report.plan["work_dir"]) / "fired"
    for zombie in zombies:
        woke = float(_json(markers / f"{zombie}.resumed")["at"])
        where = report.fired[zombie]
        commit = location(report.plan["checkpoints"]) / str(where["query"]) / "commits"
        decided = (commit / str(where["batch"])).stat().st_mtime
        assert woke >= decided, f"{zombie} went on before its batch was committed"
    _check_the_driver_alone_was_cut_off(report)
    lost = [e for e in schedule if Entry.parse(e).action == "executor"]
    assert len(lost) >= 2 * len(expected) - 1, lost

    # Losing executors lost shuffle output: Spark re-ran map stages (fetch failures or
    # resubmitted stages) and numbered task attempts again in new stage attempts.
    runs = sorted(markers.parent.glob("run-*.log"))
    logs = "\n".join(p.read_text(errors="replace") for p in runs)
    assert re.search(r"FetchFailed|Resubmitt|Lost executor", logs), "no executor was ever lost"


def _check_the_driver_alone_was_cut_off(report: Report) -> None:
    """The partition ran; the driver and the tasks each reached PostgreSQL through their
    own proxy (Toxiproxy's log names the proxy of every client it accepted); the driver's
    commit met the partition and waited it out (no query failed); nothing but the
    driver's proxy ever refused a connection."""
    outages = " ".join(run.service_crashed or "" for run in report.runs)
    assert "postgres driver partition (at after-prepare)" in outages, report.runs
    assert not [r.query_failures for r in report.runs if r.query_failures], report.runs
    work = Path(report.plan["work_dir"])
    accepted: Counter[str] = Counter()
    for line in (work / "toxiproxy" / "toxiproxy.log").read_text().splitlines():
        entry = json.loads(line)
        if entry.get("message") == "Accepted client":
            accepted[str(entry.get("name"))] += 1
    assert accepted["postgres"] and accepted["postgres-driver"], accepted
    logs = "\n".join(p.read_text(errors="replace") for p in work.glob("run-*.log"))
    refused = set(re.findall(r'connection to server at "([0-9.]+)", port \d+ failed', logs))
    assert refused == {DRIVER_ADDRESS}, refused
    assert re.search(r"is unreachable: .*; asking again", logs), "the driver never asked again"


def _json(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded
