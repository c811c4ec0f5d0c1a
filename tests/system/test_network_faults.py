"""Network faults through a real TCP proxy (Toxiproxy, built from its Go module) between
the pipeline and Kafka (each broker's proxied listener: source and sink), PostgreSQL and
Redis, in the middle of the running-count cell whose
fault points also fire: connections reset mid-transaction, answers held back for seconds,
a service cut off for a while. In `make soak`; CI runs one fault per service in
test_kafka_cluster's cell. Each sink must end exact with
nothing left in doubt (a query that failed on the fault is restarted by the harness's
pipeline, as an operator would, and replays).

Cost: ~45-60 s (one harness run; Toxiproxy's build, ~40 s, once per machine and cache).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from eos_connectors.dev.harness.verify import Report

pytestmark = [pytest.mark.services, pytest.mark.spark]


@pytest.mark.soak  # CI: one fault per store in test_kafka_cluster's cell
def test_resets_delays_and_cuts_between_the_pipeline_and_its_stores(
    eos_verify: Callable[..., Report],
) -> None:
    faults: tuple[str, ...] = ("postgres:reset", "redis:reset", "postgres:cut", "redis:latency")
    faults += ("kafka:reset", "kafka:latency", "kafka:cut")
    report = eos_verify(
        cells=("running-count",),
        sinks=("kafka", "postgres", "redis"),
        network_faults=faults,
        full_crashes="none",
        kills=0,
        records=8000,
    )
    assert report.ok, report.problems
    seen = " ".join(r.service_crashed or "" for r in report.runs)
    for fault in faults:
        service, _, kind = fault.partition(":")
        assert f"{service} network {kind}" in seen, report.runs
    assert {s.sink: (s.lost, s.duplicated, s.wrong, len(s.leftovers)) for s in report.sinks} == {
        "rc-kafka": (0, 0, 0, 0),
        "rc-postgres": (0, 0, 0, 0),
        "rc-redis-increment": (0, 0, 0, 0),
    }
