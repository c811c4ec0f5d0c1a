"""RowsAhead: a sink task's first rows are pulled while the task gets ready."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from eos_connectors.core.ahead import RowsAhead


def test_the_first_item_is_asked_for_before_the_task_iterates() -> None:
    asked = threading.Event()

    def rows() -> Iterator[int]:
        asked.set()
        yield 1
        yield 2

    with RowsAhead(rows()) as ahead:
        # The task's own set-up runs here; Spark is already asked for the first batch.
        assert asked.wait(5), "the first item was not asked for until the task iterated"
        assert list(ahead) == [1, 2]


def test_items_come_once_in_order_and_a_second_read_fails() -> None:
    with RowsAhead(iter([1, 2, 3])) as ahead:
        assert list(ahead) == [1, 2, 3]
        with pytest.raises(RuntimeError, match="read once"):
            list(ahead)
    nothing: list[int] = []
    with RowsAhead(iter(nothing)) as empty:
        assert list(empty) == []


def test_an_error_of_the_first_item_is_raised_in_the_task() -> None:
    def rows() -> Iterator[int]:
        raise ConnectionResetError("Spark went away")
        yield 1

    with RowsAhead(rows()) as ahead, pytest.raises(ConnectionResetError, match="went away"):
        list(ahead)


def test_leaving_unread_waits_for_the_thread() -> None:
    """A skipped batch returns without its rows: no thread may go on reading Spark's
    stream once the task returned."""
    release, done = threading.Event(), threading.Event()

    def rows() -> Iterator[int]:
        release.wait(5)
        time.sleep(0.2)  # still reading when the task leaves
        done.set()
        yield 1

    with RowsAhead(rows()):
        release.set()
    assert done.is_set()
