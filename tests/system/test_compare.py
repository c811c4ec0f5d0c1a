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
        "--reference-rounds",
        "1",
        "--max-rounds",
        "1",
        "--pipelines",
        ",".join(PIPELINES),
        "--report-dir",
        str(tmp_path / "report"),
    ]
    assert main(argv) == 0

    results = json.loads((tmp_path / "report" / "compare.json").read_text())["results"]
    # in a round's order (pipelines.ORDER), whatever order --pipelines named them in
    assert [r["pipeline"]["key"] for r in results] == ["spark-kafka", "eos-redis", "quix", "raw"]
    for r in results:
        key = r["pipeline"]["key"]
        assert r["error"] is None, key
        (figures,) = r["rounds"]
        # steady records/s is of the second half (the first is start-up and warm-up)
        assert 0 < figures["records"] <= 100_000 and figures["rate"] > 0, key
        # the whole run: every record, from the start call on; a Spark pipeline's start-up
        # and warm-up make it slower than its steady state
        assert figures["whole_records"] == 200_000 and figures["whole_rate"] > 0, key
        if r["pipeline"]["engine"] != "quix":
            assert figures["whole_rate"] < figures["rate"], key
        lat = figures["latency_p50_ms"], figures["latency_p99_ms"]
        assert lat[0] is not None and 0 < lat[0] <= lat[1], key
        assert figures["latency_samples"] >= 6 * 1000 * 0.8, key  # the whole window
        assert figures["recovery_s"] is not None and figures["recovery_s"] > 0, key
        # start-up counts from the query being ready, the first commit from the process's
        # start: the second holds the first and the start before it (a JVM, Spark's planners)
        assert 0 < figures["startup_s"] < figures["first_commit_s"], key
        # RSS every sample, PSS every fourth: the raw loop's phase may end before a second
        assert figures["commit_ms"] and figures["rss_mb"]["driver"] > 20, key
        assert 0 < figures["pss_mb"]["driver"] <= figures["rss_mb"]["driver"], key
    by_key = {r["pipeline"]["key"]: r["rounds"][0] for r in results}
    # output volume: Quix writes a count per input record; the Spark pipelines (complete
    # mode) every key's count each batch; the raw loop each changed key's
    assert by_key["quix"]["outputs"] == 200_000
    assert by_key["eos-redis"]["outputs"] == 1000 * 10  # 1,000 keys, 10 batches
    assert by_key["spark-kafka"]["outputs"] == 1000 * 10
    assert 1000 <= by_key["raw"]["outputs"] < 200_000
    # both kinds of Python process of an eos pipeline: the task workers, and Spark's
    # driver-side planners and runners of its data sources
    assert by_key["eos-redis"]["pss_mb"]["tasks"] > 0
    assert by_key["eos-redis"]["pss_mb"]["planners"] > 0
    assert by_key["spark-kafka"]["pss_mb"]["jvm"] > 100
    assert "addBatch" in by_key["eos-redis"]["stages_ms"]
    assert "sink commit (part of addBatch)" in by_key["eos-redis"]["stages_ms"]

    text = (tmp_path / "report" / "compare.md").read_text()
    for heading in ("## Machine", "## Targets", "## Throughput", "## Memory", "## Microseconds"):
        assert heading in text
    assert all(f"| {key} |" in text for key in PIPELINES)
    assert "eos bench compare --records 200000 --batch-records 20000" in text
    png = (tmp_path / "report" / "compare.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
