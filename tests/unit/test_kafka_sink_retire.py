"""A task's producer destroyed off the task's path (``clients.retire``): on the reaper
thread, not while the task still holds it, and for good once it lets go. A real
librdkafka producer, with no broker to reach (nothing here talks to one); ~0.3 s."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from confluent_kafka import KafkaError, Producer

from eos_connectors.sinks.kafka.clients import retire


def _librdkafka_threads() -> int:
    """This process's threads that librdkafka started (named ``rdk:...``); a thread that
    ends while they are listed is not counted."""
    return sum(map(_is_librdkafkas, Path("/proc/self/task").glob("*/comm")))


def _is_librdkafkas(comm: Path) -> bool:
    try:
        return comm.read_text().startswith("rdk:")
    except OSError:  # the thread ended after the listing (gone, or no such process)
        return False


class _Witness:
    """An error callback that notes the thread its producer was destroyed on: the
    producer drops it right after ``rd_kafka_destroy``, on the same thread."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def __call__(self, error: KafkaError) -> None:
        pass

    def __del__(self) -> None:
        self.seen.append(threading.current_thread().name)


def test_a_retired_producer_is_destroyed_on_the_reaper_once_the_task_lets_go() -> None:
    before, seen = _librdkafka_threads(), list[str]()
    producer = Producer(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "transactional.id": "retire",
            "error_cb": _Witness(seen),
        }
    )
    assert _librdkafka_threads() > before
    retire(producer)
    time.sleep(0.2)
    # still the task's: the reaper never destroys what its caller holds
    assert _librdkafka_threads() > before and seen == []
    del producer
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    assert seen == ["eos-kafka reaper"]  # destroyed there, not by the test's `del`
    assert _librdkafka_threads() == before
