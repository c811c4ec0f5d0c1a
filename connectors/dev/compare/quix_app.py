"""The Quix Streams baseline: the keyed count with ``processing_guarantee="exactly-once"``.

Runs in a virtualenv of its own (``EOS_QUIX_PYTHON``, else one in the package's
cache: Quix Streams pins an older confluent-kafka than this package uses), so it
imports nothing from the package.
``python quix_app.py BOOTSTRAP INPUT OUTPUT GROUP STATE_DIR`` prints the same
``EOS-EVENT`` lines as the Spark pipelines: ``ready``, then one ``batch`` per
checkpoint commit with its records and the commit's duration.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from quixstreams import Application  # type: ignore[import-not-found]
from quixstreams.checkpointing import checkpoint  # type: ignore[import-not-found]

COMMIT_INTERVAL = 1.0  # seconds; Spark's micro-batches run back to back


def event(name: str, **fields: Any) -> None:
    print("EOS-EVENT " + json.dumps({"event": name, "t": time.time(), **fields}), flush=True)


class Counted:
    records = 0


def timed_commits() -> None:
    """Report each checkpoint commit: flush, changelogs, transaction commit, state flush."""
    commit = checkpoint.Checkpoint.commit

    def timed(self: Any, *args: Any, **kwargs: Any) -> None:
        began = time.perf_counter()
        commit(self, *args, **kwargs)
        records, Counted.records = Counted.records, 0
        if records:
            event(  # one output record per input record
                "batch",
                records=records,
                outputs=records,
                commit_ms=(time.perf_counter() - began) * 1000,
            )

    checkpoint.Checkpoint.commit = timed


def count(value: bytes, state: Any) -> bytes:
    total = int(state.get("count", 0)) + 1
    state.set("count", total)
    Counted.records += 1
    return str(total).encode()


def main(bootstrap: str, source: str, sink: str, group: str, state_dir: str) -> None:
    timed_commits()
    app = Application(
        broker_address=bootstrap,
        consumer_group=group,
        auto_offset_reset="earliest",
        processing_guarantee="exactly-once",
        commit_interval=COMMIT_INTERVAL,
        state_dir=state_dir,
        loglevel="WARNING",
        # A SIGKILLed member stays in the group until its session times out; 10 s
        # instead of 45 s keeps the recovery measurement about Quix, not the broker.
        consumer_extra_config={"session.timeout.ms": 10_000},
    )
    records = app.topic(source, key_deserializer="bytes", value_deserializer="bytes")
    counts = app.topic(sink, key_serializer="bytes", value_serializer="bytes")
    app.dataframe(records).apply(count, stateful=True).to_topic(counts)
    event("ready")
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:6])
