"""What differs between the supported PySpark releases (connectors/core/spark_api.py), checked
on the release CI runs; `make spark-matrix` runs the quickstart and the conformance suite on
every one.

- The task context carries the batch id, query id and run id the sinks name units by.
- What only 4.1+ or 4.2+ has (``@pytest.mark.newer_spark``: Spark's read limits and the
  source's lag metrics, the state rescale, Unix-socket workers) runs on the highest
  release too, when CI's is the lowest: on 4.0 those tests check a refusal or a
  stand-in, or are skipped.
- The reader of PySpark 4.0-4.1 (`latestOffset()` with no start nor limit) plans every
  record once, in Spark's call order on those releases (a restarted query's last batch
  planned again before anything else), with `legacyReadLimits` bounding each batch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from eos_connectors.core.spark_api import release
from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.release_venv import HIGHEST, VENVS, python_of, runs_on
from eos_connectors.sources.kafka.options import parse_options
from eos_connectors.sources.kafka.stream_reader import LegacyKafkaStreamReader
from tests.kafka_util import produce_plain

pytestmark = [pytest.mark.services, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.full  # every sink test of CI's release depends on it; the matrix runs it on each
@pytest.mark.cost(15)
def test_every_task_reads_the_batch_query_and_run_ids_the_driver_commits() -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    run = subprocess.run(
        [sys.executable, "-m", "eos_connectors.dev.release_check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "match the driver's" in run.stdout


@pytest.mark.other_release
@pytest.mark.cost(65)
@pytest.mark.skipif(release() == HIGHEST, reason="this session runs them on the highest")
def test_what_only_newer_releases_have_passes_on_the_highest(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    """Those tests, in a pytest of the highest release's virtualenv (~20 s of Spark's start
    and ~40-55 s of tests in CI, beside the services tier), against this worker's
    services."""
    python = python_of(HIGHEST, ROOT / VENVS)
    command = [python, "-m", "pytest", "-q", "-m", "newer_spark and not soak and not full"]
    command += ["-p", "no:cacheprovider", f"--junitxml={tmp_path / 'junit-newer-spark.xml'}"]
    command += ["--basetemp", str(tmp_path / "pytest"), "tests/spark"]
    run = subprocess.run(
        command,
        cwd=ROOT,
        env={**_outside_xdist(), **endpoints.as_env(), **runs_on(python)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in run.stdout and " skipped" not in run.stdout, run.stdout[-2000:]


def _outside_xdist() -> dict[str, str]:
    """This environment without pytest's and pytest-xdist's variables (a nested pytest is
    no worker of this one's)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


def _read_all(
    reader: LegacyKafkaStreamReader, start: dict[str, Any], end: dict[str, Any]
) -> list[int]:
    values: list[int] = []
    for partition in reader.partitions(start, end):
        for batch in reader.read(partition):
            values.extend(int(v) for v in batch.column("value").to_pylist())
    return values


@pytest.mark.cost(3)
def test_the_legacy_reader_bounds_batches_and_reads_each_record_once_across_a_restart(
    endpoints: Endpoints, unique: str
) -> None:
    topic = f"legacy-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    produce_plain(endpoints.kafka_bootstrap, topic, [str(i).encode() for i in range(100)])
    options = parse_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "subscribe": topic,
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": "30",
            "legacyReadLimits": "true",
        }
    )
    # A new query on 4.0-4.1: latestOffset() first, then initialOffset(), then the batch.
    reader = LegacyKafkaStreamReader(options)
    end = reader.latestOffset()
    start = reader.initialOffset()
    seen = _read_all(reader, start, end)
    assert len(seen) == 30
    start, end = end, reader.latestOffset()
    seen += _read_all(reader, start, end)
    assert len(seen) == 60
    # A restart: a new reader; Spark plans the checkpoint's last batch again first.
    restarted = LegacyKafkaStreamReader(options)
    restarted.partitions(end, end)
    start, end = end, restarted.latestOffset()
    seen += _read_all(restarted, start, end)
    start, end = end, restarted.latestOffset()
    seen += _read_all(restarted, start, end)
    assert start != end
    assert restarted.latestOffset() == end  # nothing new: the same offset, no batch
    assert sorted(seen) == list(range(100))


@pytest.mark.cost(1)
def test_the_legacy_reader_refuses_a_batch_that_would_end_before_its_start(
    endpoints: Endpoints, unique: str
) -> None:
    topic = f"legacy-back-{unique}"
    create_topic(endpoints.kafka, topic)
    produce_plain(endpoints.kafka_bootstrap, topic, [str(i).encode() for i in range(10)])
    raw = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "subscribe": topic}
    reader = LegacyKafkaStreamReader(parse_options({**raw, "startingOffsets": "earliest"}))
    end = reader.latestOffset()
    behind = LegacyKafkaStreamReader(parse_options({**raw, "startingOffsets": "earliest"}))
    early = {**behind.initialOffset()}
    with pytest.raises(Exception, match="end before its start"):
        behind.partitions(end, early)
