"""Start checks run once per driver: Spark calls streamWriter at a query's start and
twice per batch, each in a new Python process of the driver JVM."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

import eos_connectors
from eos_connectors.core.startup import (
    SPARK_WORKER_ENV,
    _driver_identity,
    forget_ended_drivers,
    once_per_driver,
    start_key,
)


def _counting(fail: list[bool]) -> tuple[list[int], Callable[[], None]]:
    calls: list[int] = []

    def check() -> None:
        calls.append(1)
        if fail and fail.pop(0):
            raise RuntimeError("server not configured")

    return calls, check


# What a process forked from Spark's Python daemon has (Spark 4.3's commit runners), over
# loopback TCP and over Unix domain sockets.
FORKED_ENV = [
    {"PYTHON_WORKER_FACTORY_SECRET": "not-a-real-secret"},
    {"PYTHON_UNIX_DOMAIN_ENABLED": "True", "PYTHON_WORKER_FACTORY_SOCK_DIR": "/tmp"},
]


@pytest.mark.parametrize("forked", FORKED_ENV, ids=["tcp", "unix-sockets"])
def test_in_a_process_spark_started_the_checks_run_once_after_they_pass(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, forked: dict[str, str]
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name in SPARK_WORKER_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in forked.items():
        monkeypatch.setenv(name, value)
    calls, check = _counting([True])
    with pytest.raises(RuntimeError):
        once_per_driver("eos_redis|a", check)
    for _ in range(3):
        once_per_driver("eos_redis|a", check)
    assert len(calls) == 2, "a failed check is repeated; a passed one is not"
    once_per_driver("eos_redis|b", check)
    assert len(calls) == 3, "other settings are checked on their own"


def test_a_sink_that_starts_on_a_checkpoint_after_another_one_checks_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A notebook's driver runs sink B on a checkpoint, then sink A, then B again: B's
    second start checks again (a switch back mid-batch must be refused), while the calls
    of one run (its batches) and a sink on another checkpoint do not move its tenure."""
    from pyspark.sql.types import StringType, StructField, StructType

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("PYTHON_WORKER_FACTORY_SECRET", "not-a-real-secret")
    schema = StructType([StructField("value", StringType())])
    a = {"checkpointLocation": "file:///c", "sinkId": "a"}  # the same checkpoint as b's
    b = {"checkpointLocation": "/c", "sinkId": "b"}
    elsewhere = {"checkpointLocation": "/other", "sinkId": "c"}
    calls, check = _counting([])

    def start(options: dict[str, str]) -> None:
        once_per_driver(start_key("eos_kafka", options, schema), check)

    for options in (b, b, elsewhere, b, a, a, elsewhere):
        start(options)
    assert len(calls) == 3, "b, the other checkpoint's sink and a check once each"
    start(b)
    assert len(calls) == 4, "b starting after a is a new start"
    start(b)
    assert len(calls) == 4
    assert start_key("eos_kafka", {"sinkId": "b"}, schema).endswith("|"), "no checkpoint"


def test_outside_spark_the_checks_always_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for name in SPARK_WORKER_ENV:
        monkeypatch.delenv(name, raising=False)
    calls, check = _counting([])
    for _ in range(3):
        once_per_driver("eos_postgres|a", check)
    assert len(calls) == 3


def test_a_new_driver_deletes_the_markers_of_ended_drivers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("PYTHON_WORKER_FACTORY_SECRET", "not-a-real-secret")
    markers = tmp_path / f"eos-start-checks-{os.getuid()}"
    markers.mkdir()
    parent = _driver_identity()
    assert parent is not None
    pid, started = parent.split("-")
    live_other_sink = markers / f"{parent}-{'a' * 24}"
    reused_pid = markers / f"{pid}-{int(started) + 1}-{'b' * 24}"
    ended = markers / f"{2**22 + 7}-12345-{'c' * 24}"  # above Linux's largest pid
    for marker in (live_other_sink, reused_pid, ended):
        marker.touch()
    calls, check = _counting([])
    once_per_driver("eos_kafka|a", check)
    left = set(markers.iterdir())
    assert live_other_sink in left, "a live driver's marker is kept"
    assert reused_pid not in left and ended not in left, "ended drivers' markers go"
    assert len(left) == 2 and len(calls) == 1
    assert forget_ended_drivers(markers) == 0


def test_another_users_driver_runs_its_checks_beside_a_directory_it_cannot_write(
    tmp_path: Path,
) -> None:
    """Markers are kept per OS user: a second user's driver, finding the first user's
    marker directories (and one of its own name it cannot write), still runs its checks
    and starts, instead of failing with PermissionError as one shared directory made it."""
    if os.getuid() != 0 or shutil.which("runuser") is None:
        pytest.fail("this test runs a driver as user 'nobody': it needs root and runuser")
    nobody = pwd.getpwnam("nobody").pw_uid
    tmp_path.chmod(0o755)
    for name in (
        "eos-start-checks",
        f"eos-start-checks-{os.getuid()}",
        f"eos-start-checks-{nobody}",
    ):
        (tmp_path / name).mkdir(mode=0o755)  # root's, not writable by nobody
    script = (
        "from eos_connectors.core.startup import once_per_driver\n"
        "once_per_driver('eos_redis|x', lambda: print('checked'))\n"
    )
    # the OS's Python: the venv's may sit under a home directory nobody cannot enter
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    site = Path(psutil.__file__).parents[1]  # the venv's packages (psutil), readable by all
    env = {"TMPDIR": str(tmp_path), "PATH": os.environ["PATH"]}
    package = Path(eos_connectors.__file__).parents[1]  # where eos_connectors imports from
    env["PYTHONPATH"] = os.pathsep.join([str(package), str(site)])
    env["PYTHON_WORKER_FACTORY_SECRET"] = "not-a-real-secret"
    result = subprocess.run(
        ["runuser", "-u", "nobody", "--", python, "-c", script],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, "checked\n"), result.stderr


# A driver's Python process as Spark 4.3 starts a planner: forked from a daemon (here a
# Python process that starts it) whose parent is the driver (the JVM; here a process of
# this test). It asks for one answer and prints it, after "computed" when it computed it.
ASK = """
import subprocess, sys
worker = '''
from eos_connectors.core.startup import per_driver
def compute():
    print("computed", end=" ")
    return "answer-1"
print(per_driver("eos_kafka-broker-max|x", compute))
'''
subprocess.run([sys.executable, "-c", worker], check=True)
"""
#: Another driver: a Python process that starts the daemon above.
_RUN_DAEMON = "import subprocess, sys; subprocess.run(sys.argv[1:], check=True)"


def _ask_as_a_forked_planner(driver: str, env: dict[str, str]) -> str:
    """``driver``: "this" (this test's process is the driver) or "another" (a Python process
    of its own, started here, is)."""
    daemon = [sys.executable, "-c", ASK]
    command = daemon if driver == "this" else [sys.executable, "-c", _RUN_DAEMON, *daemon]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_planners_of_one_driver_share_its_answers_whatever_daemon_they_fork_from(
    tmp_path: Path,
) -> None:
    """Spark 4.3 forks the write's planner and the commit's from daemons of their own: the
    commit's must find what the write's found (the start checks, the broker's limit) under
    the same driver, not ask the broker again on batch 0's way to its commit; another
    driver asks on its own."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHON_WORKER_FACTORY_SECRET": "x"}
    env["PYTHONPATH"] = str(Path(eos_connectors.__file__).parents[1])
    first = _ask_as_a_forked_planner("this", env)
    second = _ask_as_a_forked_planner("this", env)
    elsewhere = _ask_as_a_forked_planner("another", env)
    assert (first, second, elsewhere) == ("computed answer-1", "answer-1", "computed answer-1")
