"""The marker log's record format: one JSON object per marker, keyed by the marker group.

Written by the sink's tasks inside their transactions and read by a task whose group
offset is gone, by ``eos sinks``, and by the driver of ``commitMode=task`` for the
source positions a replayed batch's markers kept (:func:`refuse_replanned_markers`). A
record that is not a marker (another writer on the topic) is never taken for one:
:func:`decode` returns None for it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from confluent_kafka import KafkaException

from eos_connectors.core.checkpoint_behind import refuse_replanned
from eos_connectors.core.errors import EosError, keeping_code
from eos_connectors.core.topics import Record, end_offsets, read_to_end
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.options import ids_prefix

if TYPE_CHECKING:
    from eos_connectors.sinks.kafka.options import KafkaSinkOptions

log = logging.getLogger(__name__)

#: Seconds a task waits for the marker log (the transactions open on it to end).
READ_TIMEOUT = 60.0


class Marker(NamedTuple):
    next_batch: int
    query: str
    topic: str  # the marker topic; "" in a log record written before it said so
    #: ``commitMode=task``: a digest of the source positions the stream's ``offsets/N``
    #: planned for the batch marked (:func:`~eos_connectors.core.checkpoint_behind.
    #: planned_offsets`); "" when unknown (a batch job, a checkpoint the driver cannot
    #: read, a record written before markers kept it).
    offsets: str = ""


def encode(marker: Marker) -> bytes:
    body = {"next_batch": marker.next_batch, "query": marker.query, "topic": marker.topic}
    return json.dumps({**body, "offsets": marker.offsets} if marker.offsets else body).encode()


def decode(value: bytes) -> Marker | None:
    """The marker in a log record's value, or None when the value is not one."""
    try:
        saved = json.loads(value)
        topic, offsets = str(saved.get("topic", "")), str(saved.get("offsets", ""))
        return Marker(int(saved["next_batch"]), str(saved["query"]), topic, offsets)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def read_settled(options: KafkaSinkOptions, what: str) -> list[Record]:
    """Task: every record of the marker log, read under read_committed up to the high
    watermark once every transaction open now has ended: other tasks' transactions
    write the log too, and one still open must not hide a record committed after it
    began. A broker error is a KafkaSinkError naming ``what`` was being read."""
    try:
        return read_to_end(
            options.client_config(),
            options.marker_log,
            timeout=READ_TIMEOUT,
            settled=True,
        )
    except EosError as exc:
        raise _failed(options, what, exc) from None


def read_for(options: KafkaSinkOptions, keys: Callable[[bytes], bool], what: str) -> list[Record]:
    """Task or driver: the marker log's records, enough to find the last record of each
    key that ``keys`` accepts, waiting for open transactions only when one could hide
    such a record.

    A transaction open on the log hides every record after its first (the last stable
    offset), committed or not. A task partition's marker is written only by its own
    transactional id, which the task has fenced before it reads (none of that id's
    transactions is open), a sink's claim only by a task that claims it, and either by
    ``eos sinks reset``. So when no record past the last stable offset (read
    uncommitted: the open and the aborted ones too) has a wanted key, the committed
    records before it hold the last ones, at once; otherwise the log is read settled
    (:func:`read_settled`). A first batch no longer waits behind another task
    partition's attempt, or another sink's, that died with its transaction open: that
    transaction ends only when Spark retries the dead task, and with every task slot
    held by first batches waiting for it, the retry never ran until their reads timed
    out (60 s)."""
    config = options.client_config()
    try:
        stable = end_offsets(config, options.marker_log, "read_committed")
        high = end_offsets(config, options.marker_log, "read_uncommitted")
        tail = {p: (stable.get(p, end), end) for p, end in high.items()}
        hidden = read_to_end(config, options.marker_log, "read_uncommitted", tail, READ_TIMEOUT)
        if not any(r.key is not None and keys(r.key) for r in hidden):
            committed = {p: (0, end) for p, end in stable.items()}
            return read_to_end(
                config, options.marker_log, "read_committed", committed, READ_TIMEOUT
            )
    except EosError as exc:
        raise _failed(options, what, exc) from None
    return read_settled(options, what)  # outside the try: its errors are wrapped already


def _failed(options: KafkaSinkOptions, what: str, exc: EosError) -> KafkaSinkError:
    """A broker error while reading the marker log for ``what``, keeping its code."""
    return keeping_code(
        KafkaSinkError(
            f"Reading the marker log {options.marker_log!r} for {what} failed: {exc}. Nothing "
            "was written; the task fails so Spark retries it."
        ),
        exc,
    )


def marked_over(
    options: KafkaSinkOptions, keys: Callable[[bytes], bool], batch: int, query: str | None
) -> dict[str, str]:
    """Driver: marker group -> the source positions' digest its last marker in the log
    recorded, for every group ``keys`` accepts whose marker says ``batch`` was the last
    marked (by ``query``, unless None) and kept a digest. The committed records before
    the log's last stable offset, never waiting: a transaction left open by an attempt of
    the run that died (which only its retry ends) must not hold a start or a commit up;
    a marker behind one is not seen, and the check passes."""
    last: dict[bytes, bytes] = {}
    records = read_to_end(options.client_config(), options.marker_log, "read_committed")
    for record in records:
        if record.key is not None and keys(record.key):
            last[record.key] = record.value or b""
    found: dict[str, str] = {}
    for key, value in last.items():
        marker = decode(value) if value else None
        if marker is None or not marker.offsets or marker.next_batch != batch + 1:
            continue
        if query is None or marker.query == query:
            found[key.decode(errors="replace")] = marker.offsets
    return found


def refuse_replanned_markers(
    options: KafkaSinkOptions,
    sid: str,
    batch: int,
    planned: str,
    partitions: set[int] | None = None,
    query: str | None = None,
    lenient: bool = False,
) -> None:
    """Driver, at a stream's commit of ``batch`` (task partitions ``partitions`` found it
    marked) or at a start that replays it (every task partition of sink ``sid``, marked
    by ``query``): refuse when a marker of the batch recorded other source positions than
    ``planned``, the digest of the ``offsets/N`` the checkpoint holds now (a checkpoint
    put back by exactly one batch: :func:`~eos_connectors.core.checkpoint_behind.
    refuse_replanned`). The marker log is read only when ``planned`` is known; a failed
    read is raised, or with ``lenient`` (the commit: a second guard, never a reason to
    fail a batch) logged."""
    if not planned:
        return
    prefix = ids_prefix(options, sid).encode()

    def mine(key: bytes) -> bool:
        rest = key[len(prefix) :] if key.startswith(prefix) else b""
        return rest.isdigit() and (partitions is None or int(rest) in partitions)

    try:
        found = marked_over(options, mine, batch, query)
    except (EosError, KafkaException) as exc:
        if not lenient:
            raise
        log.warning("batch %d of sink %s: its markers could not be read: %s", batch, sid, exc)
        return
    for over in sorted(set(found.values())):
        refuse_replanned("eos_kafka", sid, batch, over, planned)
