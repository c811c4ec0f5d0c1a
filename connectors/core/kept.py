"""Clients one process keeps across tasks or commits (Spark reuses its Python workers, and
runs a query's commits in one worker it keeps), lent out one use at a time."""

from __future__ import annotations

import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

T = TypeVar("T")

#: Every pool of this process, for :func:`close_idle`.
_POOLS: weakref.WeakSet[Kept[Any]] = weakref.WeakSet()


class Kept(Generic[T]):
    """Idle clients by key. :meth:`lent` takes one out (so two users never share it) or
    makes it, keeps it again after a use that ended normally and closes it after one that
    failed (a call may have left it mid-request). At most ``size`` stay idle, the least
    recently used closed first."""

    def __init__(self, close: Callable[[T], None], size: int) -> None:
        self.close = close
        self.size = size
        self._idle: OrderedDict[str, T] = OrderedDict()
        self.created = 0  # for tests
        _POOLS.add(self)

    @contextmanager
    def lent(self, key: str, make: Callable[[], T]) -> Iterator[T]:
        client = self._idle.pop(key, None)
        if client is None:
            self.created += 1
            client = make()
        try:
            yield client
        except BaseException:
            self.close(client)
            raise
        self._idle[key] = client  # taken out: goes last
        while len(self._idle) > self.size:
            _, oldest = self._idle.popitem(last=False)
            self.close(oldest)

    def clear(self) -> None:
        """Close every idle client (one lent out is kept by its user)."""
        while self._idle:
            _, client = self._idle.popitem(last=False)
            self.close(client)


def close_idle() -> None:
    """Close the idle clients of every pool of this process. A test process that drives
    many writers keeps each pool's clients across its tests, and their sockets add up:
    past 1,024 file descriptors a library that still uses ``select()`` fails (Py4J's
    callback server, started late, never answered a streaming listener's first call)."""
    for pool in list(_POOLS):
        pool.clear()
