"""The harness itself: the bounded CI run over all three sinks, a sink named by format
and options, and bad input that must fail clearly and in bounded time."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from connectors.endpoints import Endpoints
from connectors.faults import POINTS
from connectors.harness.checks import postgres_counts
from connectors.harness.verify import CustomSink, Plan, Report, VerifyError, verify

pytestmark = [pytest.mark.services, pytest.mark.spark]


def test_all_sinks_through_every_fault_point_kills_and_a_redis_crash(
    endpoints: Endpoints, eos_verify: Callable[..., Report]
) -> None:
    """CI's bounded run: >= 20k records, >= 6 crashes covering every fault point."""
    report = eos_verify(records=20_000, fault_rounds=1, kills=1, restarts=("redis",))
    assert report.ok, (report.problems, report.table(), [s.leftovers for s in report.sinks])
    assert {s.sink for s in report.sinks} == {"kafka", "postgres", "redis"}
    assert report.crashes >= 7
    assert [r.service_crashed for r in report.runs if r.service_crashed] == ["redis"]
    fired = {r.ended_by.removeprefix("fault ").split("@")[0] for r in report.runs}
    assert set(POINTS) <= fired
    assert all(s.expected > 10_000 and s.lost == s.duplicated == 0 for s in report.sinks)


_TABLE = "verify_custom_sink"


def read_custom_table() -> dict[str, int]:
    """The --sink-reader of the custom-sink test: the counts eos_postgres holds."""
    endpoints = Endpoints.from_env()
    assert endpoints is not None
    return postgres_counts(endpoints.postgres_dsn, _TABLE)[0]


def test_a_sink_named_by_format_and_options(
    endpoints: Endpoints, eos_verify: Callable[..., Report]
) -> None:
    options = (("dsn", endpoints.postgres_dsn), ("table", _TABLE), ("mode", "upsert"),
               ("keyColumns", "word"), ("createTable", "true"))  # fmt: skip
    custom = CustomSink("eos_postgres", f"{__name__}:read_custom_table", options)
    report = eos_verify(records=3_000, sinks=(), custom=custom, fault_rounds=0, kills=1)
    assert report.ok, (report.problems, report.table())
    assert [s.sink for s in report.sinks] == ["eos_postgres"]
    assert report.crashes == 1


def test_a_sink_format_that_does_not_exist_fails_fast(
    endpoints: Endpoints, eos_verify: Callable[..., Report]
) -> None:
    began = time.monotonic()
    custom = CustomSink("no_such_sink", f"{__name__}:read_custom_table")
    report = eos_verify(records=1_000, sinks=(), custom=custom, fault_rounds=0, kills=0)
    assert not report.ok and time.monotonic() - began < 180
    assert "failed on its own" in report.problems[0]
    assert "no_such_sink" in report.problems[0]


def test_a_pipeline_that_never_progresses_is_stopped(
    endpoints: Endpoints, eos_verify: Callable[..., Report]
) -> None:
    began = time.monotonic()
    custom = CustomSink("stuck", f"{__name__}:read_custom_table",
                        register="tests.pipelines.stuck_sink:StuckSink")  # fmt: skip
    report = eos_verify(
        records=1_000, sinks=(), custom=custom, fault_rounds=0, kills=0, stall_timeout=45
    )
    assert not report.ok and time.monotonic() - began < 240
    assert "made no progress for 45 s" in report.problems[0]


def test_bad_plans_are_refused_before_anything_runs(endpoints: Endpoints, tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="Unknown sink 'mongo'"):
        verify(Plan(sinks=("mongo",), work_dir=tmp_path), endpoints)
    with pytest.raises(VerifyError, match="Unknown fault point 'before-lunch'"):
        verify(Plan(fault_points=("before-lunch",), work_dir=tmp_path), endpoints)
    with pytest.raises(VerifyError, match="too few for"):
        verify(Plan(records=50, work_dir=tmp_path), endpoints)
