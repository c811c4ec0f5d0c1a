"""The other end of the supported PySpark range: CI runs every test on the release its
``.venv`` holds, and this runs the conformance suite's reference cell (``running-count``:
a transformWithState stage) into the Kafka sink with every fault point on the other end of
the range, in a virtualenv that holds just that PySpark (connectors/dev/release_venv.py).
What differs between releases is the source's reader and the writers' base class, which
every sink shares: the Kafka sink's batch commit crosses both, and the source's own point;
the query restarts after each point, so its reader starts again from the checkpoint each
time (a whole-pipeline crash as well is the matrix's). ``make spark-matrix`` runs every
cell with every sink on every minor.

In ``make full``, not CI: CI has no room for it (a fresh clone's CI took 16m02s with it:
81 s there, building the release's virtualenv and Spark class archive first). CI crosses
the reader of 4.0-4.1 in Spark's call order on its own release
(tests/spark/test_spark_releases.py). Cost: ~35 s warm, ~80 s on a fresh clone.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from eos_connectors.core.spark_api import release
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.release_venv import HIGHEST, LOWEST, release_venv

pytestmark = [pytest.mark.services, pytest.mark.spark, pytest.mark.full]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.cost(35)
def test_the_reference_cell_crosses_every_point_on_the_other_end_of_the_range(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    other = LOWEST if release() == HIGHEST else HIGHEST
    python = release_venv(other, ROOT / ".venvs")
    report_path = tmp_path / "report.json"
    command = [str(python), "-m", "eos_connectors.cli", "verify", "--records", "2000"]
    command += ["--sinks", "kafka", "--kills", "0", "--full-crashes", "none"]
    command += ["--work-dir", str(tmp_path / "verify")]
    command += ["--report", str(report_path)]
    run = subprocess.run(
        command,
        env={**os.environ, **endpoints.as_env(), "PYSPARK_PYTHON": str(python)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    report = json.loads(report_path.read_text())
    assert report["ok"] and not report["problems"], report["problems"]
    assert set(report["fired"]) == set(report["plan"]["schedule"]), "a fault point never fired"
    sinks = {s["sink"] for s in report["sinks"]}
    assert sinks == {"rc-kafka"}
    points = {entry.split("@")[0] for entry in report["fired"]}
    assert points >= {"after-prepare", "after-decision", "between-commits", "after-commit"}
    assert "source-read" in points
    versions = subprocess.run(
        [str(python), "-c", "import pyspark; print(pyspark.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert versions.stdout.strip() == other
