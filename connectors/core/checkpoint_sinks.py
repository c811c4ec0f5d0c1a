"""Which sinks a query commits to, written into its own checkpoint.

Every exactly-once sink of this package, when its query starts (on the driver),
records itself in ``<checkpoint>/eos/sinks/<store>-<sink id>.json``: the store,
the sink id, the query, the target and the names its bookkeeping lives under,
and where the store is (host and port, never a credential). Tools that act on a
checkpoint (``eos savepoint restore --mode resume``) then check exactly the sinks
the query wrote to, instead of whatever stores the environment happens to name,
and refuse when one of them cannot be reached.

The sink sees its checkpoint when the query sets it with
``.option("checkpointLocation", ...)``; one set through
``spark.sql.streaming.checkpointLocation`` is not passed to sinks, so nothing is
recorded then (the tools say so). Checkpoints on a local path, a ``file:`` URI (a
shared mount) and ``hdfs:`` (through WebHDFS, :mod:`eos_connectors.core.webhdfs`) are
written; on another store (``s3a:``...) nothing is recorded, and the tools say so.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from eos_connectors.core.checkpoint_behind import planned_offsets
from eos_connectors.core.errors import EosError
from eos_connectors.core.webhdfs import WebHdfs

log = logging.getLogger(__name__)

FOLDER = Path("eos") / "sinks"


@dataclass(frozen=True)
class SinkEntry:
    """One sink a query commits to, as its checkpoint records it."""

    store: str  # "postgres", "redis" or "kafka"
    sink_id: str
    query_id: str
    target: str  # table, key prefix or topic
    endpoint: str  # host:port[/database], no credentials
    names: Mapping[str, str] = field(default_factory=dict)  # bookkeeping names, by option

    @property
    def relative(self) -> str:
        """Where the entry lives, relative to the checkpoint."""
        return entry_path(self.store, self.sink_id)


def entry_path(store: str, sink_id: str) -> str:
    """The checkpoint-relative path of ``store``'s entry for ``sink_id``."""
    return f"{FOLDER.as_posix()}/{store}-{sink_id}.json"


class _Files(Protocol):
    """A checkpoint's files, by path relative to it."""

    def read(self, relative: str) -> str | None: ...

    def names(self, relative: str) -> list[str]:
        """The names in the folder ``relative``; [] when there is none."""

    def replace(self, relative: str, text: str) -> None:
        """Write ``text`` to a new file and rename it over ``relative`` (atomic)."""


@dataclass(frozen=True)
class _LocalFiles:
    root: Path

    def read(self, relative: str) -> str | None:
        path = self.root / relative
        return path.read_text() if path.is_file() else None

    def names(self, relative: str) -> list[str]:
        path = self.root / relative
        return [p.name for p in path.iterdir()] if path.is_dir() else []

    def replace(self, relative: str, text: str) -> None:
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        partial.write_text(text)
        partial.replace(path)


@dataclass(frozen=True)
class _HdfsFiles:
    hdfs: WebHdfs
    root: str  # the checkpoint's path on HDFS

    def read(self, relative: str) -> str | None:
        return self.hdfs.read_text(f"{self.root}/{relative}")

    def names(self, relative: str) -> list[str]:
        return self.hdfs.names(f"{self.root}/{relative}")

    def replace(self, relative: str, text: str) -> None:
        path = f"{self.root}/{relative}"
        folder, name = path.rsplit("/", 1)
        partial = f"{folder}/.{name}.{uuid.uuid4().hex[:8]}"
        self.hdfs.write_text(partial, text)  # CREATE makes the parent folders
        self.hdfs.rename(partial, path)


def checkpoint_files(location: str | None) -> _Files | None:
    """The files of a ``checkpointLocation``: a local directory (or ``file:``, as a shared
    mount is) or an ``hdfs:`` one (over WebHDFS); None for another scheme."""
    if not location:
        return None
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return _LocalFiles(Path(parsed.path if parsed.scheme else location))
    if parsed.scheme == "hdfs":
        return _HdfsFiles(WebHdfs.for_uri(location), parsed.path.rstrip("/"))
    return None


def record(files: _Files, entry: SinkEntry) -> None:
    """Driver: write ``entry`` into the checkpoint unless it is there already (atomically:
    a temporary file renamed over)."""
    relative = entry.relative
    text = json.dumps(asdict(entry), indent=2, sort_keys=True) + "\n"
    if files.read(relative) != text:
        files.replace(relative, text)


def record_at_start(options: Mapping[str, str], entry: Callable[[str], SinkEntry]) -> None:
    """Driver, at a query's start: record the sink ``entry(query id)`` describes in the
    checkpoint named by the ``checkpointLocation`` option, when there is one to write. A
    failure is logged, never raised: recording is for the tools, and a query must not
    fail over it (resuming it from a savepoint is then refused: fork instead)."""
    location = checkpoint_location(options)
    files = checkpoint_files(location)
    if files is None:
        if location:
            log.info("checkpoint %s: sinks are recorded on local and hdfs: ones only", location)
        return
    try:
        metadata = files.read("metadata")
        if metadata is None:
            log.info("no query id in %s yet: sink not recorded in the checkpoint", location)
            return
        record(files, entry(str(json.loads(metadata)["id"])))
    except (OSError, ValueError, KeyError, EosError) as exc:
        log.warning("could not record the sink in checkpoint %s: %s", location, exc)


def recorded_entry(location: str | None, store: str, sink_id: str) -> SinkEntry | None:
    """Driver, at a query's start and before :func:`record_at_start` replaces it: the
    entry an earlier start recorded for ``store`` and ``sink_id`` in the checkpoint, with
    the bookkeeping names it used; None when there is none or it cannot be read."""
    files = checkpoint_files(location)
    if files is None:
        return None
    relative = entry_path(store, sink_id)
    try:
        text = files.read(relative)
        return None if text is None else SinkEntry(**json.loads(text))
    except (OSError, ValueError, TypeError, EosError) as exc:
        log.warning("could not read %s of checkpoint %s: %s", relative, location, exc)
        return None


@dataclass(frozen=True)
class Planned:
    """Where a checkpoint stands: the last batch Spark planned (``offsets/<N>``; -1 before
    the first), whether it recorded that batch complete (``commits/<N>``), and the digest
    of the source positions it planned for it
    (:func:`~eos_connectors.core.checkpoint_behind.planned_offsets`; "" before the first)."""

    last: int
    complete: bool
    offsets: str = ""

    @property
    def incomplete(self) -> int | None:
        """The batch the next start replays: the last planned one, unless complete."""
        return None if self.complete or self.last < 0 else self.last


def planned_batches(location: str | None) -> Planned | None:
    """Driver: where the checkpoint stands (:class:`Planned`); None when it cannot be read
    (another scheme, or an error, logged)."""
    files = checkpoint_files(location)
    if files is None:
        return None
    try:
        last, digest = last_planned(files)
        if last < 0:
            return Planned(-1, True)
        return Planned(last, files.read(f"commits/{last}") is not None, digest)
    except (OSError, EosError) as exc:
        log.warning("could not read the offsets of checkpoint %s: %s", location, exc)
        return None


def last_planned(files: _Files) -> tuple[int, str]:
    """Driver: the checkpoint's last planned batch (-1: none) and the digest of the source
    positions its ``offsets/N`` plans ("" when unread); raises what reading raises."""
    last = max((int(name) for name in files.names("offsets") if name.isdigit()), default=-1)
    return last, planned_offsets(files.read(f"offsets/{last}")) if last >= 0 else ""


def checkpoint_location(options: Mapping[str, str]) -> str | None:
    """The ``checkpointLocation`` option Spark hands the sink (any case), if set."""
    return next((v for k, v in options.items() if k.lower() == "checkpointlocation"), None)


def checkpoint_query_id(location: str | None) -> str | None:
    """Driver: the query id in the checkpoint's ``metadata`` file; None when there is no
    checkpoint this module can read, no metadata yet, or it cannot be read (logged)."""
    files = checkpoint_files(location)
    if files is None:
        return None
    try:
        metadata = files.read("metadata")
        return None if metadata is None else str(json.loads(metadata)["id"])
    except (OSError, ValueError, KeyError, EosError) as exc:
        log.warning("could not read the query id in checkpoint %s: %s", location, exc)
        return None


def sink_of_checkpoint(location: str | None, sink_id: Callable[[str], str]) -> str | None:
    """Driver, in an abort no task reported to: ``sink_id`` of the query id in the
    checkpoint's metadata; None when it cannot be read."""
    query_id = checkpoint_query_id(location)
    return None if query_id is None else sink_id(query_id)


def postgres_endpoint(dsn: str) -> str:
    """``host:port/database`` of a libpq DSN or URL (no user, no password)."""
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(dsn)
    host = str(parts.get("host") or "localhost")
    return f"{host}:{parts.get('port') or 5432}/{parts.get('dbname') or ''}"


def redis_endpoint(url: str) -> str:
    """``host:port/db`` of a Redis URL (no user, no password)."""
    parsed = urlparse(url)
    database = parsed.path.strip("/") or "0"
    return f"{parsed.hostname or 'localhost'}:{parsed.port or 6379}/{database}"
