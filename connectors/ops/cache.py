"""Where the package keeps what it downloads or builds once per user: jars, class archives."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def cache_root() -> Path:
    """``EOS_CACHE_DIR``, else ``$XDG_CACHE_HOME/eos-connectors`` (``~/.cache`` by default)."""
    explicit = os.environ.get("EOS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "eos-connectors"


@contextlib.contextmanager
def building(lock: Path) -> Iterator[None]:
    """Hold ``lock`` (a file, created) exclusively: one process at a time builds a cache
    entry, and the others then find it built."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
