"""The harness itself: bad input must fail clearly and in bounded time. The harness's
full run is tests/system/test_conformance.py.

The two runs of a failing pipeline are the second tier's (`make full`, ~17 s): run them
when you change connectors/dev/harness; the refusal of bad plans stays in CI."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness.verify import CustomSink, Plan, Report, VerifyError, verify

pytestmark = [pytest.mark.services, pytest.mark.spark]


def read_nothing() -> dict[str, int]:
    """The --sink-reader of sinks that never get to be read."""
    return {}


@pytest.mark.full
@pytest.mark.cost(8)
def test_a_sink_format_that_does_not_exist_fails_fast(
    endpoints: Endpoints, eos_verify: Callable[..., Report]
) -> None:
    began = time.monotonic()
    custom = CustomSink("no_such_sink", f"{__name__}:read_nothing")
    report = eos_verify(records=1_000, sinks=(), custom=custom, fault_rounds=0, kills=0)
    assert not report.ok and time.monotonic() - began < 180
    assert "failed on its own" in report.problems[0]
    assert "no_such_sink" in report.problems[0]


@pytest.mark.full
@pytest.mark.cost(9)
def test_a_pipeline_that_never_progresses_is_stopped(
    endpoints: Endpoints, eos_verify: Callable[..., Report]
) -> None:
    began = time.monotonic()
    custom = CustomSink(
        "stuck", f"{__name__}:read_nothing", register="tests.pipelines.stuck_sink:StuckSink"
    )
    report = eos_verify(
        records=1_000, sinks=(), custom=custom, fault_rounds=0, kills=0, stall_timeout=8
    )
    assert not report.ok and time.monotonic() - began < 240
    assert "made no progress for 8 s" in report.problems[0]


def test_bad_plans_are_refused_before_anything_runs(endpoints: Endpoints, tmp_path: Path) -> None:
    with pytest.raises(VerifyError, match="Unknown sink 'mongo'"):
        verify(Plan(sinks=("mongo",), work_dir=tmp_path), endpoints)
    with pytest.raises(VerifyError, match="Unknown cell 'lunch'"):
        verify(Plan(cells=("lunch",), work_dir=tmp_path), endpoints)
    with pytest.raises(VerifyError, match="too few for"):
        verify(Plan(records=50, work_dir=tmp_path), endpoints)
