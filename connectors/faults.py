"""Named fault points: no-ops unless a test enables one through the environment.

``EOS_FAULT_POINT=name`` or ``name@N`` (only in batch N) enables one point, and
a comma-separated list (``after-prepare@1,after-commit@3``) several;
``EOS_FAULT_ROLE=driver|worker`` limits it to one kind of process;
``EOS_FAULT_SCOPE=process|group`` says what dies: this process (default) or the
whole query: the process group named by ``EOS_FAULT_PGID`` (driver and JVM, set by
the pipeline) and this process's own group (PySpark's worker daemon and workers);
``EOS_FAULT_MARKER=path`` makes it fire once: the file is created just before the
kill, and a point whose marker exists stays quiet, so the restarted query runs on.
With a list, ``EOS_FAULT_MARKER`` is a directory holding one marker per entry
(named like the entry), so each entry fires once.

An enabled point kills with SIGKILL, the way a crash would: no cleanup, no
exception handler, no ``finally`` block runs.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

POINTS = (
    "source-read",
    "after-prepare",
    "after-decision",
    "between-commits",
    "after-commit",
)


def point(name: str, batch: int | None = None, role: str | None = None) -> None:
    """Crash here when the environment enables ``name`` (for ``batch`` and ``role``)."""
    entries = armed()
    for entry in entries:
        point_name, _, wanted_batch = entry.partition("@")
        if point_name != name:
            continue
        if wanted_batch and str(batch if batch is not None else current_batch()) != wanted_batch:
            continue
        wanted_role = os.environ.get("EOS_FAULT_ROLE")
        if wanted_role and role is not None and wanted_role != role:
            continue
        if _claim_marker(entry if len(entries) > 1 else None):
            _crash()


def schedule(points: list[str] | tuple[str, ...], times: int, first_batch: int = 1) -> list[str]:
    """Each point ``times`` times, one per batch from ``first_batch`` on:
    ``["after-prepare@1", "after-commit@2", ...]``, the entries of an ``EOS_FAULT_POINT`` list."""
    entries = [point for _ in range(times) for point in points]
    return [f"{p}@{first_batch + i}" for i, p in enumerate(entries)]


def armed() -> list[str]:
    """The ``name[@batch]`` entries ``EOS_FAULT_POINT`` enables."""
    return [e.strip() for e in os.environ.get("EOS_FAULT_POINT", "").split(",") if e.strip()]


def current_batch() -> int | None:
    """The micro-batch id of the running Spark task, when called inside one."""
    try:
        from pyspark import TaskContext
    except ImportError:  # pragma: no cover - pyspark is a dependency
        return None
    context = TaskContext.get()
    if context is None:
        return None
    value = context.getLocalProperty("streaming.sql.batchId")
    return int(value) if value is not None else None


def _claim_marker(entry: str | None) -> bool:
    marker = os.environ.get("EOS_FAULT_MARKER")
    if not marker:
        return True
    path = Path(marker)
    if entry is not None:
        path.mkdir(parents=True, exist_ok=True)
        path = path / entry
    try:
        with open(path, "x") as handle:
            handle.write(f"{os.getpid()}\n")
    except FileExistsError:
        return False
    return True


def _crash() -> None:
    if os.environ.get("EOS_FAULT_SCOPE") == "group":
        # PySpark's worker daemon runs in a process group of its own: kill the query's
        # group (named by the pipeline in EOS_FAULT_PGID), then the daemon's.
        query_group = int(os.environ.get("EOS_FAULT_PGID") or os.getpgid(0))
        os.killpg(query_group, signal.SIGKILL)
        os.killpg(os.getpgid(0), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
