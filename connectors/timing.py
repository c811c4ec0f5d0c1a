"""How long each batch's commit took, for the logs and for ``eos bench``."""

from __future__ import annotations

import json
import logging
import os

log = logging.getLogger(__name__)


def record_commit(sink_id: str, batch_id: int, units: int, seconds: float) -> None:
    """Log a commit's duration; with ``EOS_COMMIT_TIMES=path`` also append it there as a
    JSON line. ``eos bench`` reads the file: sinks commit in Python workers that the
    JVM starts (the driver's commit, or each task's transaction), not in the
    pipeline's own Python process. One short ``O_APPEND`` write per line, so
    concurrent tasks do not interleave."""
    log.info("batch %d of sink %s: %d units committed in %.1f ms", batch_id, sink_id, units,
             seconds * 1000)  # fmt: skip
    _append({"sink": sink_id, "batch": batch_id, "units": units, "ms": seconds * 1000})


def record_task(stage: str, batch_id: int | None, seconds: float) -> None:
    """One task's time in a stage of ours ("source read", "sink write"), for the profile
    ``eos bench`` prints; only with ``EOS_COMMIT_TIMES`` set."""
    if batch_id is not None:
        _append({"stage": stage, "batch": batch_id, "ms": seconds * 1000})


def _append(line: dict[str, object]) -> None:
    path = os.environ.get("EOS_COMMIT_TIMES")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line) + "\n")
