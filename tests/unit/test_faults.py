"""Fault points: entries addressed by batch, query and action, each firing once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eos_connectors.core import faults


class CrashedError(Exception):
    pass


@pytest.fixture
def crashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    fired: list[str] = []

    def kill(scope: str) -> None:
        fired.append(scope)
        raise CrashedError

    monkeypatch.setattr(faults, "_kill", kill)
    return fired


def test_an_unarmed_point_is_a_no_op(monkeypatch: pytest.MonkeyPatch, crashes: list[str]) -> None:
    monkeypatch.delenv("EOS_FAULT_POINT", raising=False)
    faults.point("after-commit", 3)
    assert crashes == []


def test_entries_parse_and_print_back() -> None:
    entry = faults.Entry.parse("after-prepare@3:kafka=pause")
    assert entry == faults.Entry("after-prepare", 3, "kafka", "pause")
    assert str(entry) == "after-prepare@3:kafka=pause"
    assert str(faults.Entry.parse("after-commit")) == "after-commit"
    one_task = faults.Entry.parse("before-prepare@0#3:q=group")
    assert one_task == faults.Entry("before-prepare", 0, "q", "group", partition=3)
    assert str(one_task) == "before-prepare@0#3:q=group"
    assert one_task.matches("before-prepare", 0, "q", 3)
    assert not one_task.matches("before-prepare", 0, "q", 2)
    for bad in ("before-lunch", "after-commit=explode", "after-commit@x", "after-commit#x"):
        with pytest.raises(ValueError, match="EOS_FAULT_POINT entry"):
            faults.Entry.parse(bad)


def test_a_list_fires_each_entry_once_in_its_batch_and_query(
    monkeypatch: pytest.MonkeyPatch, crashes: list[str], tmp_path: Path
) -> None:
    schedule = faults.schedule(["after-prepare", "after-commit"], times=2, query="kafka")
    assert schedule == [
        "after-prepare@1:kafka",
        "after-commit@2:kafka",
        "after-prepare@3:kafka",
        "after-commit@4:kafka",
    ]
    monkeypatch.setenv("EOS_FAULT_POINT", ",".join(schedule))
    monkeypatch.setenv("EOS_FAULT_MARKER", str(tmp_path / "fired"))
    faults.point("after-commit", 1, query="kafka")  # wrong batch
    faults.point("after-commit", 2, query="postgres")  # wrong query
    faults.point("after-decision", 2, query="kafka")  # not armed
    with pytest.raises(CrashedError):
        faults.point("after-commit", 2, role="worker", query="kafka")
    faults.point("after-commit", 2, query="kafka")  # fired once already: the query runs on
    with pytest.raises(CrashedError):
        faults.point("after-prepare", 3, query="kafka")
    fired = faults.fired(tmp_path / "fired")
    assert sorted(fired) == ["after-commit@2:kafka", "after-prepare@3:kafka"]
    assert fired["after-commit@2:kafka"]["query"] == "kafka"
    assert fired["after-commit@2:kafka"]["role"] == "worker"


def test_a_single_entry_uses_the_marker_file_and_the_role(
    monkeypatch: pytest.MonkeyPatch, crashes: list[str], tmp_path: Path
) -> None:
    monkeypatch.setenv("EOS_FAULT_POINT", "after-decision")
    monkeypatch.setenv("EOS_FAULT_ROLE", "driver")
    monkeypatch.setenv("EOS_FAULT_SCOPE", "group")
    monkeypatch.setenv("EOS_FAULT_MARKER", str(tmp_path / "marker"))
    faults.point("after-decision", 5, role="worker")
    with pytest.raises(CrashedError):
        faults.point("after-decision", 5, role="driver")
    assert json.loads((tmp_path / "marker").read_text())["batch"] == 5
    faults.point("after-decision", 6, role="driver")
    assert crashes == ["group"]


def test_a_paused_point_returns_once_resumed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    killed: list[int] = []
    monkeypatch.setattr(faults, "executor_jvm", lambda pid=None: 4242)
    monkeypatch.setattr("os.kill", lambda pid, sig: killed.append(pid))
    monkeypatch.setattr("signal.signal", lambda sig, handler: None)
    monkeypatch.setenv("EOS_FAULT_POINT", "before-prepare@1=pause")
    monkeypatch.setenv("EOS_FAULT_MARKER", str(tmp_path))
    (tmp_path / "before-prepare@1=pause.resume").touch()
    faults.point("before-prepare", 1)
    assert killed == [4242], "the zombie kills its executor before it waits"
    assert (tmp_path / "before-prepare@1=pause.resumed").exists()


@pytest.mark.parametrize("action", ["hold", "restart"])
def test_a_held_point_kills_nothing_and_goes_on_once_resumed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, crashes: list[str], action: str
) -> None:
    """``hold`` waits for the harness, ``restart`` for the pipeline that stops its query
    (connectors/dev/harness/pipeline.py): neither kills anything itself."""
    import threading

    monkeypatch.setattr("os.kill", lambda pid, sig: pytest.fail("a hold killed something"))
    entry = f"after-decision@2:pg={action}"
    monkeypatch.setenv("EOS_FAULT_POINT", entry)
    monkeypatch.setenv("EOS_FAULT_MARKER", str(tmp_path))
    held = threading.Thread(target=faults.point, args=("after-decision", 2, "driver", "pg"))
    held.start()
    held.join(0.5)
    assert held.is_alive(), "the held step went on before the harness resumed it"
    assert json.loads((tmp_path / entry).read_text())["role"] == "driver"
    assert faults.Entry.parse(entry).action == action
    (tmp_path / f"{entry}.resume").touch()
    held.join(5)
    assert not held.is_alive() and crashes == []
    assert (tmp_path / f"{entry}.resumed").exists()


def test_simulate_raises_in_process_once() -> None:
    with faults.simulate("after-decision@2"):
        faults.point("after-decision", 1)
        with pytest.raises(faults.SimulatedCrash):
            faults.point("after-decision", 2)
        faults.point("after-decision", 2)
