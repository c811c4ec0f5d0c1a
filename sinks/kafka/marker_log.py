"""The marker log's record format: one JSON object per marker, keyed by the marker group.

Written by the sink's tasks inside their transactions and read by a task whose group
offset is gone and by ``eos sinks``. A record that is not a marker (another writer on
the topic) is never taken for one: :func:`decode` returns None for it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, NamedTuple

from eos_connectors.core.errors import EosError, keeping_code
from eos_connectors.core.topics import Record, read_to_end
from eos_connectors.sinks.kafka.errors import KafkaSinkError

if TYPE_CHECKING:
    from eos_connectors.sinks.kafka.options import KafkaSinkOptions

#: Seconds a task waits for the marker log (the transactions open on it to end).
READ_TIMEOUT = 60.0


class Marker(NamedTuple):
    next_batch: int
    query: str
    topic: str  # the marker topic; "" in a log record written before it said so


def encode(marker: Marker) -> bytes:
    return json.dumps(
        {"next_batch": marker.next_batch, "query": marker.query, "topic": marker.topic}
    ).encode()


def decode(value: bytes) -> Marker | None:
    """The marker in a log record's value, or None when the value is not one."""
    try:
        saved = json.loads(value)
        return Marker(int(saved["next_batch"]), str(saved["query"]), str(saved.get("topic", "")))
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
        raise keeping_code(
            KafkaSinkError(
                f"Reading the marker log {options.marker_log!r} for {what} failed: {exc}. Nothing "
                "was written; the task fails so Spark retries it."
            ),
            exc,
        ) from None
