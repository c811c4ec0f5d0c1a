"""Run pipelines as their own process groups, crash them, and restart them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def env(**extra: str) -> dict[str, str]:
    """The test's environment without fault settings, plus ``extra``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("EOS_FAULT")}
    base["PYTHONPATH"] = str(ROOT)
    base.update(extra)
    return base


def fault_env(point: str, batch: int, marker: Path, scope: str = "group") -> dict[str, str]:
    return env(
        EOS_FAULT_POINT=f"{point}@{batch}",
        EOS_FAULT_SCOPE=scope,
        EOS_FAULT_MARKER=str(marker),
    )


def run(command: list[str], environment: dict[str, str], timeout: float = 600) -> int:
    """Run to completion (or crash); always leaves no process of the group behind."""
    proc = subprocess.Popen(command, cwd=ROOT, env=environment, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    finally:
        kill_group(proc)


def start_logged(
    command: list[str], environment: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """Start the pipeline as a process group of its own, its output (both streams) in
    ``log``; the caller ends it with :func:`kill_group`."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            command,
            cwd=ROOT,
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def kill_when(
    command: list[str],
    environment: dict[str, str],
    ready: Callable[[], bool],
    delay: float,
    timeout: float = 300,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Start the pipeline, wait until ``ready()``, call ``on_ready``, wait ``delay`` more,
    then SIGKILL it."""
    proc = subprocess.Popen(command, cwd=ROOT, env=environment, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, f"pipeline exited with {proc.returncode} before the kill"
            assert time.monotonic() < deadline, "pipeline made no progress"
            time.sleep(0.1)
        if on_ready is not None:
            on_ready()
        time.sleep(delay)
    finally:
        kill_group(proc)


def progress_after(checkpoint: Path) -> Callable[[], bool]:
    """True once the query commits a batch more than it had now."""
    done = committed_batches(checkpoint)
    return lambda: committed_batches(checkpoint) > done


def committed_batches(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    return len(list(commits.glob("[0-9]*"))) if commits.exists() else 0
