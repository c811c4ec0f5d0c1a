"""The harness's pipeline process ends once its queries are done, even when stopping
its session hangs (removing the last listener over Spark Connect can deadlock:
SPARK-59623). Cost: ~0.3 s."""

from __future__ import annotations

import threading
import time
from typing import Any

from eos_connectors.dev.harness.pipeline import stopped_within


class Streams:
    def __init__(self) -> None:
        self.removed: list[Any] = []

    def removeListener(self, listener: Any) -> None:
        self.removed.append(listener)


class Session:
    def __init__(self, hang: threading.Event | None = None) -> None:
        self.streams = Streams()
        self.hang = hang
        self.stops = 0

    def stop(self) -> None:
        self.stops += 1
        if self.hang is not None:
            self.hang.wait()


def test_a_session_that_stops_has_its_listener_removed_first() -> None:
    session, listener = Session(), object()
    assert stopped_within(session, listener, timeout=5.0)  # type: ignore[arg-type]
    assert session.streams.removed == [listener]
    assert session.stops == 1


def test_a_stop_that_hangs_is_given_up_after_the_timeout() -> None:
    release = threading.Event()
    session = Session(hang=release)
    began = time.monotonic()
    try:
        assert not stopped_within(session, None, timeout=0.2)  # type: ignore[arg-type]
        assert time.monotonic() - began < 2.0
        assert session.streams.removed == [] and session.stops == 1
    finally:
        release.set()
