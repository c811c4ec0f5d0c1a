"""Two live runs of one batch job version on a Spark standalone cluster (a scheduler's retry
while the first attempt still runs), each its own application with its tasks in the
executors' Python workers: the run that claimed the version last is the one that
writes; the other fails saying so, with nothing of it visible.

CI runs the same race with both runs in local mode
(tests/spark/test_batch_write.py::test_two_runs_of_a_batch_commit_version_at_once_write_it_once);
this is its cluster shape, in `make soak` (~60 s: two applications on the cluster).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from tests.pipeline_util import env, kill_group, start_logged
from tests.spark.test_batch_write import _claimed, _kafka_values

pytestmark = [pytest.mark.services, pytest.mark.spark, pytest.mark.cluster]

ROWS = 400


def _start(job: dict[str, str], master: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tests.pipelines.version_run", "--options", json.dumps(job)]
    return start_logged([*command, "--master", master, *args], env(), log)


@pytest.mark.soak
def test_two_runs_of_one_version_on_a_cluster_write_it_once(
    spark_master: str, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """Run A (one task, held until run B claimed the version) decides after B's claim and
    before B decides (B's tasks are held until A ended): A fails, B writes every row once,
    in its own split (two tasks) and its own ``rand()``."""
    out = f"cruns-{unique}"
    create_topic(endpoints.kafka, out, partitions=2)
    job = {
        "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
        "topic": out,
        "sinkId": unique,
        "commitMode": "batch",
        "txnVersion": "9",
    }
    go, a_ended = tmp_path / "b-claimed", tmp_path / "a-ended"
    logs = tmp_path / "a.log", tmp_path / "b.log"
    run_a = _start(job, spark_master, logs[0], "--wait-for", str(go), "--row-ms", "0")
    run_b: subprocess.Popen[bytes] | None = None
    try:
        a_claim = _claimed(endpoints, job)
        run_b = _start(job, spark_master, logs[1], "--partitions", "2", "--wait-for", str(a_ended))
        _claimed(endpoints, job, after=a_claim)
        go.touch()
        code_a = run_a.wait(timeout=300)
        a_ended.touch()
        codes = code_a, run_b.wait(timeout=300)
    finally:
        for proc in (run_a, run_b):
            if proc is not None:
                kill_group(proc)
    said = [log.read_text(errors="replace") for log in logs]
    assert codes == (3, 0), f"exit codes {codes}: {said[0][-2000:]} {said[1][-2000:]}"
    assert "started after this one" in said[0], said[0][-2000:]
    values = _kafka_values(endpoints.kafka_bootstrap, out)
    written = Counter(v.split(b"|")[0] for v in values.elements())
    assert written == Counter({f"v{i}".encode(): 1 for i in range(ROWS)})
