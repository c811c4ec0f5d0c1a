"""Fault points: armed by the environment, one entry or a list, each firing once."""

from __future__ import annotations

from pathlib import Path

import pytest

from connectors import faults
from tests.pipeline_util import fault_schedule


class CrashedError(Exception):
    pass


@pytest.fixture
def crashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    fired: list[str] = []

    def crash() -> None:
        fired.append("crash")
        raise CrashedError

    monkeypatch.setattr(faults, "_crash", crash)
    return fired


def test_an_unarmed_point_is_a_no_op(monkeypatch: pytest.MonkeyPatch, crashes: list[str]) -> None:
    monkeypatch.delenv("EOS_FAULT_POINT", raising=False)
    faults.point("after-commit", 3)
    assert crashes == []


def test_a_list_fires_each_entry_once_in_its_batch(
    monkeypatch: pytest.MonkeyPatch, crashes: list[str], tmp_path: Path
) -> None:
    schedule = fault_schedule(["after-prepare", "after-commit"], times=2)
    assert schedule == "after-prepare@1,after-commit@2,after-prepare@3,after-commit@4"
    monkeypatch.setenv("EOS_FAULT_POINT", schedule)
    monkeypatch.setenv("EOS_FAULT_MARKER", str(tmp_path / "fired"))
    faults.point("after-commit", 1)  # wrong batch
    faults.point("after-decision", 2)  # not armed
    with pytest.raises(CrashedError):
        faults.point("after-commit", 2)
    faults.point("after-commit", 2)  # fired once already: the restarted query runs on
    with pytest.raises(CrashedError):
        faults.point("after-prepare", 3)
    assert sorted(p.name for p in (tmp_path / "fired").iterdir()) == [
        "after-commit@2",
        "after-prepare@3",
    ]


def test_a_single_entry_uses_the_marker_file_and_the_role(
    monkeypatch: pytest.MonkeyPatch, crashes: list[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("EOS_FAULT_POINT", "after-decision")
    monkeypatch.setenv("EOS_FAULT_ROLE", "driver")
    monkeypatch.setenv("EOS_FAULT_MARKER", str(tmp_path / "marker"))
    faults.point("after-decision", 5, role="worker")
    with pytest.raises(CrashedError):
        faults.point("after-decision", 5, role="driver")
    assert (tmp_path / "marker").is_file()
    faults.point("after-decision", 6, role="driver")
    assert crashes == ["crash"]
