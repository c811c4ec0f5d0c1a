"""Task side: Spark's first rows pulled on a thread while a sink task gets ready.

A sink task of a stateful query waits for its first Arrow batch while Spark reads
the shuffle and updates the state store (in complete mode, the whole partition's
state before the first row). Its own set-up before any row (a producer, the
transaction's first broker calls, the marker, or a store's owner and decision
checks) is network round trips that need no rows. :class:`RowsAhead` asks for the
first batch on a thread as the task starts, so the two waits overlap instead of
adding up. Both wait with the GIL released (a socket read; librdkafka, psycopg or
redis-py waiting on the network).

Nothing is written before the task's checks pass: the thread only reads Spark's
stream. Items come out once, in order: the first from the thread, the rest pulled
by the task itself. Leaving the ``with`` block always waits for the thread, so no
thread still reads Spark's stream when the task returns (a skipped batch) or fails.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Generic, TypeVar

T = TypeVar("T")


class RowsAhead(Generic[T]):
    """``items``' first item, asked for on a thread from the moment this is built."""

    def __init__(self, items: Iterator[T]) -> None:
        self._items = items
        self._first: list[T] = []
        self._error: BaseException | None = None
        self._taken = False
        self._thread = threading.Thread(target=self._pull, name="eos-rows-ahead", daemon=True)
        self._thread.start()

    def _pull(self) -> None:
        try:
            self._first.append(next(self._items))
        except StopIteration:
            pass
        except BaseException as exc:  # raised in the task's own thread, by __iter__
            self._error = exc

    def __iter__(self) -> Iterator[T]:
        """The items, once: waits for the thread's, then pulls the rest itself."""
        if self._taken:
            raise RuntimeError("RowsAhead is read once")
        self._taken = True
        self._thread.join()
        if self._error is not None:
            raise self._error
        yield from self._first
        self._first.clear()
        yield from self._items

    def __enter__(self) -> RowsAhead[T]:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._thread.join()
