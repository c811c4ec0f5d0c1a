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
recorded then (the tools say so). Only checkpoints on a file system this process
can open (a local path, or a ``file:`` URI, as a shared mount is) are written.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from eos_connectors.core.errors import EosError

log = logging.getLogger(__name__)

FOLDER = Path("eos") / "sinks"


class CheckpointSinksError(EosError):
    """A checkpoint's record of its sinks cannot be read."""


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
    def file_name(self) -> str:
        return f"{self.store}-{self.sink_id}.json"


def checkpoint_dir(location: str | None) -> Path | None:
    """The local directory of a ``checkpointLocation`` option, None for another scheme."""
    if not location:
        return None
    parsed = urlparse(location)
    if parsed.scheme in ("", "file"):
        return Path(parsed.path if parsed.scheme else location)
    return None


def query_id_of(checkpoint: Path) -> str | None:
    """The query id Spark wrote to ``<checkpoint>/metadata`` when the query was created."""
    try:
        return str(json.loads((checkpoint / "metadata").read_text())["id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record(checkpoint: Path, entry: SinkEntry) -> None:
    """Driver: write ``entry`` into the checkpoint unless it is there already (atomically:
    a temporary file renamed over). A failure is logged, never raised: recording is for
    the tools, and a query must not fail over it."""
    path = checkpoint / FOLDER / entry.file_name
    text = json.dumps(asdict(entry), indent=2, sort_keys=True) + "\n"
    try:
        if path.is_file() and path.read_text() == text:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        partial.write_text(text)
        partial.replace(path)
    except OSError as exc:
        log.warning("could not record sink %s in checkpoint %s: %s", entry.sink_id, checkpoint, exc)


def entries(checkpoint: Path) -> list[SinkEntry] | None:
    """The sinks recorded in ``checkpoint``, None when it records none (an older version
    of the package ran it, or its sinks could not see the checkpoint's location)."""
    folder = checkpoint / FOLDER
    if not folder.is_dir():
        return None
    found = []
    for path in sorted(folder.glob("*.json")):
        try:
            raw = json.loads(path.read_text())
            found.append(SinkEntry(**{**raw, "names": dict(raw.get("names", {}))}))
        except (OSError, ValueError, TypeError) as exc:
            raise CheckpointSinksError(
                f"{path} is not a sink record of this package: {exc}"
            ) from None
    return found


def record_at_start(options: Mapping[str, str], entry: Callable[[str], SinkEntry]) -> None:
    """Driver, at a query's start: record the sink ``entry(query id)`` describes in the
    checkpoint named by the ``checkpointLocation`` option, when there is one to write."""
    location = next((v for k, v in options.items() if k.lower() == "checkpointlocation"), None)
    checkpoint = checkpoint_dir(location)
    if checkpoint is None:
        return
    query_id = query_id_of(checkpoint)
    if query_id is None:
        log.info("no query id in %s yet: sink not recorded in the checkpoint", checkpoint)
        return
    record(checkpoint, entry(query_id))


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
