"""The marker log's record format: one JSON object per marker, keyed by the marker group.

Written by the sink's tasks inside their transactions and read by a task whose group
offset is gone and by ``eos sinks``. A record that is not a marker (another writer on
the topic) is never taken for one: :func:`decode` returns None for it.
"""

from __future__ import annotations

import json
from typing import NamedTuple


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
