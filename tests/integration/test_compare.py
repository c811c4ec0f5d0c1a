"""``eos bench compare`` end to end on the real services, small: every engine kind runs
both phases (counts checked in the sink, latency samples, a SIGKILL and a recovery),
and the report, chart and JSON come out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eos_connectors.cli import main
from eos_connectors.dev.endpoints import Endpoints

pytestmark = [pytest.mark.services, pytest.mark.spark, pytest.mark.bench]

# One of each kind: this package (Redis: a polled sink), Spark's JVM connector (its
# jars resolved from Maven Central), Quix Streams (its own virtualenv), the raw loop.
PIPELINES = ("eos-redis", "spark-kafka", "quix", "raw")


def test_compare_runs_every_kind_of_pipeline_and_writes_the_report(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    argv = [
        "bench",
        "compare",
        "--records",
        "200000",
        "--batch-records",
        "20000",
        "--keys",
        "1000",
        "--rate",
        "1000",
        "--latency-seconds",
        "6",
        "--rounds",
        "1",
        "--pipelines",
        ",".join(PIPELINES),
        "--report-dir",
        str(tmp_path / "report"),
        "--out",
        str(tmp_path / "json"),
    ]
    assert main(argv) == 0

    results = json.loads((tmp_path / "json" / "compare.json").read_text())["results"]
    assert [r["pipeline"]["key"] for r in results] == list(PIPELINES)
    for r in results:
        key = r["pipeline"]["key"]
        assert r["error"] is None, key
        # records/s is of the second half (the first is start-up and warm-up)
        assert 0 < r["records"] <= 100_000 and r["rate"] > 0, key
        # the warm-up half: every batch after the start-up batch, up to the measured ones
        assert 0 < r["warmup_records"] < 200_000 - r["records"] and r["warmup_seconds"] > 0
        assert r["latency_p50_ms"] is not None and 0 < r["latency_p50_ms"] <= r["latency_p99_ms"]
        assert r["recovery_s"] is not None and r["recovery_s"] > 0, key
        assert r["commit_ms"] and r["driver_mb"] > 20, key
    spark = {r["pipeline"]["key"]: r for r in results}
    assert spark["eos-redis"]["workers_mb"] > 0 and "addBatch" in spark["eos-redis"]["stages_ms"]
    assert "sink commit (part of addBatch)" in spark["eos-redis"]["stages_ms"]

    text = (tmp_path / "report" / "compare.md").read_text()
    for heading in ("## Machine", "## Results", "## Targets", "## Where the time goes"):
        assert heading in text
    assert text.count("| (") >= len(PIPELINES)
    assert "eos bench compare --records 200000 --batch-records 20000" in text
    png = (tmp_path / "report" / "compare.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
