"""Driver: every sink's commit refuses Spark's continuous processing.

Under ``trigger(continuous=...)`` Spark (4.0 to 4.3) runs a Python sink's write without
the step that hands its rows to Python: the JVM writer of each task drops every row
(``PythonBatchWriterFactory``'s ``write(row)`` makes an error it never throws), ends each
epoch with no commit message, and the driver's ``commit`` gets ``None`` for every task,
epoch after epoch, while Spark records each epoch in the checkpoint's ``commits/`` as
written. Tried with Spark's own ``kafka`` source (it supports continuous processing)
into ``eos_kafka``: 5,200 records read, none written, ten epochs committed.

A micro-batch commit never gets ``None`` (Spark fails a task whose ``write`` returns no
message), so :func:`refuse_continuous` refuses such a commit: the epoch stays out of
``commits/``, and Spark logs the error and commits no later epoch of the run. The
offsets such a run left in the checkpoint hold no batch metadata; a later micro-batch
run of the same checkpoint would replay only the last of them, skipping the rest, so
the commit of a batch whose offsets are such a run's is refused too (before its
decision: an exactly-once batch is then aborted, nothing visible).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from eos_connectors.core.checkpoint_sinks import checkpoint_files
from eos_connectors.core.errors import ConfigError, EosError

log = logging.getLogger(__name__)

#: Checkpoints whose offsets this process could not read (warned once each).
_WARNED: set[str | None] = set()
#: Where each refusal sends the user.
_UNDER_CONTINUOUS = ' (docs/operations.md, "Continuous processing")'


class ContinuousProcessingError(ConfigError):
    """A sink ran in a query under continuous processing, which hands it no rows."""


def refuse_continuous(
    messages: Sequence[object], batch_id: int, checkpoint: str | None, connector: str
) -> str | None:
    """Driver, first in every streaming sink's ``commit``: refuse an epoch of continuous
    processing (a task with no commit message), or a batch whose ``offsets/<batch_id>``
    such a run wrote (readable only on a local or HDFS ``checkpoint``). Returns the text
    of ``offsets/<batch_id>`` (None when it cannot be read), for the commit's other
    checks (:func:`eos_connectors.core.checkpoint_behind.planned_offsets`)."""
    if any(message is None for message in messages):
        raise ContinuousProcessingError(
            f"{connector} got no rows for epoch {batch_id}: the query runs with "
            "trigger(continuous=...), under which Spark hands a Python sink none of its "
            "rows and drops them. The epoch is not committed. Stop the query and run it "
            "with trigger(processingTime=...) or trigger(availableNow=True) on a new "
            "checkpoint, reading from where this run started (its startingOffsets): "
            f"nothing it read was written.{_UNDER_CONTINUOUS}"
        )
    text = _offsets(checkpoint, batch_id)
    if text is not None and written_by_continuous(text):
        raise ContinuousProcessingError(
            f"{connector} refuses batch {batch_id}: offsets/{batch_id} of checkpoint "
            f"{checkpoint} was written by a run with trigger(continuous=...), under which "
            "Spark hands a Python sink none of its rows, so nothing that run read was "
            "written, and a micro-batch run of this checkpoint would replay only its last "
            "epoch. Run the query on a new checkpoint, reading from where the continuous "
            f"run started (its startingOffsets).{_UNDER_CONTINUOUS}"
        )
    return text


def _offsets(checkpoint: str | None, batch_id: int) -> str | None:
    """``offsets/<batch_id>`` of a local or HDFS checkpoint; None for another store, or
    when it cannot be read (logged once per checkpoint: the check is a second guard,
    never a reason to fail a batch, as a WebHDFS that refuses the driver would)."""
    try:
        files = checkpoint_files(checkpoint)
        return files.read(f"offsets/{batch_id}") if files is not None else None
    except (OSError, EosError) as exc:
        if checkpoint not in _WARNED:
            _WARNED.add(checkpoint)
            log.warning("could not read offsets/%d of checkpoint %s: %s", batch_id, checkpoint, exc)
        return None


def written_by_continuous(offsets_file: str) -> bool:
    """Whether an ``offsets/N`` file's text is a continuous run's: its second line, a
    micro-batch's metadata (watermark, batch time, SQL settings), is empty."""
    lines = offsets_file.split("\n")
    return len(lines) > 1 and lines[0].startswith("v") and not lines[1].strip()
