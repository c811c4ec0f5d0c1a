"""Exactly once in the production shape, in one run: a Spark standalone cluster (a master and
two one-core workers), a replicated Kafka (three brokers; tests/system/conftest.py), the
checkpoints on HDFS, and every fault the local cells cannot show.

The running-count cell (a shuffle before every sink, so a lost executor loses shuffle
files and Spark resubmits the stage) into Kafka, PostgreSQL and Redis, ``eos verify`` with:

* a zombie per sink: at ``before-prepare`` a task's Python worker stops, kills its own
  executor JVM and waits; Spark re-runs the task on the other executor and commits the
  batch; the harness then resumes the zombie, which prepares after the batch was decided
  (it must leave nothing visible and nothing in doubt);
* the local cells kill a task's process at every other point (``--coverage pairs``;
  `make soak` also loses executors while a task writes, after the prepare and after
  the Kafka commit);
* the input's leader broker killed at a random moment, and the Kafka sink's
  transaction coordinator killed between the driver's decision and its commits
  (``--step-fault coordinator``; the sink's default batch commit): no query may fail
  on a broker's death;
* a network fault per service through Toxiproxy: PostgreSQL's connections reset, Redis
  cut off, every broker's connections reset;
* the driver alone cut off PostgreSQL for 8 s once a task has prepared (``--step-fault
  postgres-partition``: the driver reaches PostgreSQL through a proxy of its own, the
  executors through theirs): the driver's claim, decision and commits wait it out and
  the query goes on without failing.

Every sink must end exact. This one run replaces two (the cluster's zombies and lost
executors, and the replicated Kafka's broker and network faults), which crossed the
same running-count queries twice. The driver's own points stay with the local cells
(tests/system/test_conformance.py): the driver is one process here as there.
``make soak`` runs this shape at 1M records with every broker role, every network
fault kind and PostgreSQL and Redis restarted between a decision and its commits.

Cost: ~125-155 s in CI, on top of the 3-broker stack (~20 s), HDFS (~15 s) and the Spark cluster
(~10 s), each started once for the session.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from eos_connectors.core.faults import Entry
from eos_connectors.dev.harness.network import DRIVER_ADDRESS
from eos_connectors.dev.harness.pipeline import parse_event
from eos_connectors.dev.stack.kafka_cluster import TRANSACTION_VERSION, KafkaCluster
from eos_connectors.dev.stack.kafka_tools import transaction_version
from eos_connectors.ops.locations import location
from tests.system.conftest import eos_on

pytestmark = [pytest.mark.services, pytest.mark.spark, pytest.mark.cluster, pytest.mark.hdfs]

SINKS = {"rc-kafka", "rc-postgres", "rc-redis-increment"}


@pytest.mark.cost(135)
def test_a_cluster_with_zombies_lost_executors_dead_brokers_and_cut_networks_loses_nothing(
    replicated: Path, cluster: KafkaCluster, spark_master: str, hdfs_url: str, tmp_path: Path
) -> None:
    # The replicated Kafka runs transaction protocol version 1; the local cells' broker, 2.
    assert transaction_version(cluster.bootstrap) == TRANSACTION_VERSION == 1
    work = tmp_path / "verify"
    args = ["verify", "--cells", "running-count", "--sinks", "kafka,postgres,redis"]
    args += ["--records", "4000", "--kills", "0", "--full-crashes", "none", "--coverage", "pairs"]
    args += ["--master", spark_master, "--checkpoint-root", f"{hdfs_url}/verify"]
    args += ["--kill-broker", "input-leader"]
    args += ["--network-fault", "postgres:reset", "--network-fault", "redis:cut"]
    args += ["--network-fault", "kafka:reset"]  # every broker's connections: source and sink
    args += ["--step-fault", "coordinator", "--step-fault", "postgres-partition"]
    done = eos_on(replicated, *args, "--work-dir", str(work))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    report = json.loads((work / "report.json").read_text())
    exact = (0, 0, 0, 0)
    sinks = {
        s["sink"]: (s["lost"], s["duplicated"], s["wrong"], len(s["leftovers"]))
        for s in report["sinks"]
    }
    assert sinks == dict.fromkeys(SINKS, exact), sinks
    # No broker's death fails the Kafka query: not the input leader's, not the
    # coordinator's between the decision and the commits (its commit's sweep of open
    # transactions once failed the query there), not the brokers' connections reset.
    failures = {q: n for r in report["runs"] for q, n in r["query_failures"].items()}
    assert "rc-kafka" not in failures, (failures, _query_failed(work, "rc-kafka"))
    assert report["plan"]["checkpoints"].startswith(hdfs_url), report["plan"]["checkpoints"]

    schedule = report["plan"]["schedule"]
    fired = report["fired"]
    assert set(fired) == set(schedule), "a planned fault point never fired"
    for entry, where in fired.items():
        assert where["query"] == Entry.parse(entry).query, f"{entry} fired in {where}"
    _check_the_zombies_woke_after_their_batch(report, work)
    logs = "\n".join(p.read_text(errors="replace") for p in sorted(work.glob("run-*.log")))
    # The zombies' executors died with shuffle output: Spark re-ran map stages.
    assert re.search(r"FetchFailed|Resubmitt|Lost executor", logs), "no executor was ever lost"

    outages = " ".join(r["service_crashed"] or "" for r in report["runs"])
    for fault in (
        "(input-leader)",
        "(coordinator at after-decision)",
        "postgres network reset",
        "redis network cut",
        "kafka network reset",
        "postgres driver partition (at after-prepare)",
    ):
        assert fault in outages, (fault, outages)
    _check_the_driver_alone_was_cut_off(work, logs)


def _query_failed(work: Path, query: str) -> list[str]:
    """Each ``query-failed`` event of ``query`` in the runs' logs: what the query died of."""
    lines = (line for p in sorted(work.glob("run-*.log")) for line in p.read_text().splitlines())
    events = (parse_event(line) for line in lines)
    return [
        str(e) for e in events if e and e.get("event") == "query-failed" and e.get("query") == query
    ]


def _check_the_zombies_woke_after_their_batch(report: dict[str, Any], work: Path) -> None:
    """One zombie per sink, each resumed after its batch's commit was written."""
    schedule = report["plan"]["schedule"]
    zombies = [e for e in schedule if Entry.parse(e).action == "pause"]
    assert len(zombies) == len(SINKS), zombies
    for zombie in zombies:
        woke = float(json.loads((work / "fired" / f"{zombie}.resumed").read_text())["at"])
        where = report["fired"][zombie]
        commits = location(report["plan"]["checkpoints"]) / str(where["query"]) / "commits"
        decided = (commits / str(where["batch"])).stat().st_mtime
        assert woke >= decided, f"{zombie} went on before its batch was committed"


def _check_the_driver_alone_was_cut_off(work: Path, logs: str) -> None:
    """The driver and the tasks each reached PostgreSQL through their own proxy (Toxiproxy's
    log names the proxy of every client it accepted); the driver asked again while cut
    off; only the driver's proxy ever refused a connection."""
    accepted: Counter[str] = Counter()
    for line in (work / "toxiproxy" / "toxiproxy.log").read_text().splitlines():
        entry = json.loads(line)
        if entry.get("message") == "Accepted client":
            accepted[str(entry.get("name"))] += 1
    assert accepted["postgres"] and accepted["postgres-driver"], accepted
    refused = set(re.findall(r'connection to server at "([0-9.]+)", port \d+ failed', logs))
    assert refused <= {DRIVER_ADDRESS, "127.0.0.1"}, refused
    assert DRIVER_ADDRESS in refused, "the driver's partition refused nothing"
    assert re.search(r"is unreachable: .*; asking again", logs), "the driver never asked again"
