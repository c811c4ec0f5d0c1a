"""Where the package keeps what it downloads or builds once per user: jars, class archives."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``EOS_CACHE_DIR``, else ``$XDG_CACHE_HOME/eos-connectors`` (``~/.cache`` by default)."""
    explicit = os.environ.get("EOS_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "eos-connectors"
