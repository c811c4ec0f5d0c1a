"""The other end of the supported PySpark range: CI runs every test on the lowest release
(the ``.venv``'s), and this runs the conformance suite's reference cell (``running-count``:
a transformWithState stage) into the Kafka sink with every fault point on the highest, in
a virtualenv that holds just that PySpark (connectors/dev/release_venv.py; the system
tier's prefetch builds it beside the first tiers). What differs between releases is the
source's reader (4.2+ give it read limits and ``availableNow``) and the writers' base
class, which every sink shares: the Kafka sink's batch commit crosses both, and the
source's own point; the query restarts after each point, so its reader starts again from
the checkpoint each time (a whole-pipeline crash as well is the matrix's). ``make
spark-matrix`` runs every cell with every sink on every minor.

Cost: ~50-60 s in CI, where it runs beside the services and Spark tiers, once the
virtualenv is built (~25 s of unpacking, and the download, on a fresh clone: the
prefetch's).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.release_venv import VENVS, other_end, python_of, runs_on

pytestmark = [pytest.mark.services, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.other_release
@pytest.mark.cost(55)
def test_the_reference_cell_crosses_every_point_on_the_other_end_of_the_range(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    other = other_end()
    python = python_of(other, ROOT / VENVS)
    report_path = tmp_path / "report.json"
    command = [python, "-m", "eos_connectors.cli", "verify", "--records", "2000"]
    command += ["--sinks", "kafka", "--kills", "0", "--full-crashes", "none"]
    command += ["--work-dir", str(tmp_path / "verify")]
    command += ["--report", str(report_path)]
    run = subprocess.run(
        command,
        # No class archive of its own: building one for that release took ~50 s of a
        # 92 s run (ci96); its one Spark JVM starts ~6 s slower without.
        env={**os.environ, **endpoints.as_env(), **runs_on(python), "EOS_SPARK_CLASS_ARCHIVE": "0"},
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
        [python, "-c", "import pyspark; print(pyspark.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert versions.stdout.strip() == other
