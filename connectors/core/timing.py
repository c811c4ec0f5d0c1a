"""How long each batch's commit took, for the logs and for ``eos bench``."""

from __future__ import annotations

import json
import logging
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)


def record_commit(sink_id: str, batch_id: int, units: int, seconds: float) -> None:
    """Log a commit's duration; with ``EOS_COMMIT_TIMES=path`` also append it there as a
    JSON line. ``eos bench`` reads the file: sinks commit in Python workers that the
    JVM starts (the driver's commit, or each task's transaction), not in the
    pipeline's own Python process. One short ``O_APPEND`` write per line, so
    concurrent tasks do not interleave."""
    log.info(
        "batch %d of sink %s: %d units committed in %.1f ms",
        batch_id,
        sink_id,
        units,
        seconds * 1000,
    )
    _append({"sink": sink_id, "batch": batch_id, "units": units, "ms": seconds * 1000})


def record_task(
    stage: str, batch_id: int | None, seconds: float, began: float | None = None
) -> None:
    """One task's time in a stage of ours ("source read", "sink write"), for the profile
    ``eos bench`` prints; only with ``EOS_COMMIT_TIMES`` set. ``began`` (epoch seconds)
    places the task on a batch's timeline; ``pid`` says which worker ran it."""
    if batch_id is not None:
        line = {"stage": stage, "batch": batch_id, "ms": seconds * 1000, "pid": os.getpid()}
        _append(line if began is None else {**line, "began": round(began, 3)})


#: The name under which :class:`TaskSteps` records when its task took its first rows.
FIRST_ROWS = "first rows at"


class TaskSteps:
    """Task: where one task's time goes, step by step, for ``eos bench``'s profile.

    ``add`` counts the time since a clock reading as a step; ``pulled`` the time spent
    waiting for an iterator's next item (rows from Spark).
    ``record`` writes the task's whole time as ``stage`` and each step as
    ``"<stage>: <step>"``, the time no step covers as ``"<stage>: <rest>"``. Only a
    few clock reads per Arrow batch, so it is always on. It also writes when the task
    took its first item from ``pulled`` as ``"<stage>: first rows at"`` (from the task's
    start; not a step: it overlaps the steps before it). A sink task that gets ready
    while Spark computes its rows (:class:`~eos_connectors.core.ahead.RowsAhead`) takes
    them when both are done, so set against a task that does not get ready first, it
    says whether getting ready was hidden.
    """

    def __init__(self, stage: str, batch_id: int | None, rest: str) -> None:
        self.stage, self.batch_id, self.rest = stage, batch_id, rest
        self.began = time.perf_counter()
        self.began_at = time.time()
        self.seconds: dict[str, float] = defaultdict(float)
        self.first_rows: float | None = None  # seconds from the start to the first item

    def add(self, step: str, since: float) -> float:
        """Count the time from ``since`` to now as ``step``; return now."""
        now = time.perf_counter()
        self.seconds[step] += now - since
        return now

    def pulled(self, step: str, items: Iterator[T]) -> Iterator[T]:
        """``items``, counting the wait for each as ``step``."""
        while True:
            since = time.perf_counter()
            try:
                item = next(items)
            except StopIteration:
                self.add(step, since)
                return
            now = self.add(step, since)
            if self.first_rows is None:
                self.first_rows = now - self.began
            yield item

    def record(self) -> None:
        total = time.perf_counter() - self.began
        record_task(self.stage, self.batch_id, total, self.began_at)
        for step, seconds in self.seconds.items():
            record_task(f"{self.stage}: {step}", self.batch_id, seconds)
        record_task(f"{self.stage}: {self.rest}", self.batch_id, total - sum(self.seconds.values()))
        if self.first_rows is not None:
            record_task(f"{self.stage}: {FIRST_ROWS}", self.batch_id, self.first_rows)


def _append(line: dict[str, object]) -> None:
    path = os.environ.get("EOS_COMMIT_TIMES")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
