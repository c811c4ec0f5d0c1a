"""Reading a Spark streaming checkpoint: what ``eos checkpoint inspect`` shows.

A checkpoint directory holds ``metadata`` (the query id), ``offsets/N`` (written
before batch N runs: a version line, the batch's metadata with its watermark and
the SQL settings fixed at the first start, then one line per source),
``commits/N`` (written once batch N completed), ``sources/`` and ``state/``
(``state/<operator>/<partition>/`` per state store: version V holds the state
after batch V-1, as ``V.zip``/``V.changelog`` with RocksDB or
``V.snapshot``/``V.delta`` with the HDFS-backed store; ``state/<operator>/_metadata``
describes the operator). Everything here only reads files, on any file system
(:mod:`eos_connectors.ops.locations`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from eos_connectors.core.checkpoint_behind import planned_offsets
from eos_connectors.core.continuous import written_by_continuous
from eos_connectors.ops.locations import CheckpointError, Location, location, walk_files

__all__ = ["Checkpoint", "CheckpointError", "batches", "read_checkpoint", "read_offsets"]

#: A state store version file (or its checksum): ``V.zip``, ``.V.changelog.crc``, ...;
#: under state checkpoint format 2 each carries the id of the attempt that wrote it,
#: ``V_<uuid>.changelog``.
STATE_FILE = re.compile(r"^\.?(\d+)(?:_[0-9a-f-]{36})?\.(zip|changelog|snapshot|delta)(\.crc)?$")
#: A batch's file in ``offsets/``, ``commits/`` or operator metadata (or its checksum).
BATCH_FILE = re.compile(r"^\.?(\d+)(\.crc)?$")
#: A batch file Spark was writing when its process died: written to a hidden temporary
#: file, renamed into place only once complete (``.0.<uuid>.tmp``, ``..0.<uuid>.tmp.crc``).
UNFINISHED_FILE = re.compile(r"^\.+(\d+)\.[0-9a-f-]{36}\.tmp(\.crc)?$")


@dataclass(frozen=True)
class PartitionState:
    """One state store partition's files."""

    partition: int
    files: int
    bytes: int
    latest_version: int | None
    latest_snapshot: int | None  # a full copy (.zip or .snapshot) at this version
    changelogs_since: int  # .changelog or .delta files after it, replayed on load


@dataclass(frozen=True)
class OperatorState:
    operator: int
    name: str
    partitions: tuple[PartitionState, ...]

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partitions)

    @property
    def current_partitions(self) -> int:
        """Partitions at the newest version: after a rescale, the old extra ones stay behind."""
        versions = [p.latest_version for p in self.partitions if p.latest_version is not None]
        return sum(1 for p in self.partitions if versions and p.latest_version == max(versions))


@dataclass(frozen=True)
class Checkpoint:
    """What a checkpoint directory says about its query."""

    path: Location
    query_id: str
    last_planned: int | None
    last_committed: int | None
    watermark_ms: int
    conf: dict[str, str] = field(default_factory=dict)
    #: The last planned batch's end, per source, as the source wrote it (any JSON value: a
    #: Kafka source's object of topics, a ``rate`` source's number), None for "-".
    sources: tuple[Any, ...] = ()
    operators: tuple[OperatorState, ...] = ()
    unfinished: tuple[str, ...] = ()  # offsets/ and commits/ writes a crash cut short
    #: Spark's state checkpoint format (``spark.sql.streaming.stateStore.checkpointFormatVersion``,
    #: not kept with the query's settings): 2 when the last commit names its state files'
    #: ids (``stateUniqueIds``), else 1. Spark's state reader and rewriter need the
    #: session set to it.
    state_format: int = 1
    #: The last planned batch's offsets were written under continuous processing
    #: (``trigger(continuous=...)``), which this package's sinks refuse.
    continuous: bool = False
    #: The digest of the source positions the last planned batch plans
    #: (:func:`~eos_connectors.core.checkpoint_behind.planned_offsets`), which a sink's
    #: decision of that batch recorded if it decided it over them; "" before the first.
    planned_over: str = ""

    @property
    def clean(self) -> bool:
        """Stopped between batches: the last planned batch is committed."""
        return self.last_planned is not None and self.last_planned == self.last_committed

    @property
    def shuffle_partitions(self) -> int | None:
        value = self.conf.get("spark.sql.shuffle.partitions")
        return int(value) if value else None


def batches(directory: Location) -> list[int]:
    """The batch ids with a file in ``offsets/`` or ``commits/``, ascending."""
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def read_offsets(path: Location, batch: int) -> tuple[dict[str, Any] | None, list[Any]]:
    """``offsets/<batch>``: its metadata (None in a continuous run's, which has none) and
    each source's offset (None for "-")."""
    return _parsed_offsets(path, batch, (path / "offsets" / str(batch)).read_text())


def _parsed_offsets(
    path: Location, batch: int, text: str
) -> tuple[dict[str, Any] | None, list[Any]]:
    """:func:`read_offsets` of the file's ``text``."""
    lines = text.splitlines()
    if len(lines) < 2 or not lines[0].startswith("v"):
        raise CheckpointError(f"{path / 'offsets' / str(batch)} is not a Spark offsets file.")
    metadata = None if written_by_continuous(text) else json.loads(lines[1])
    return metadata, [None if line == "-" else json.loads(line) for line in lines[2:]]


def read_checkpoint(path: Location | str) -> Checkpoint:
    """The checkpoint at ``path`` (a location or its string); CheckpointError if it is none."""
    path = (location(path) if isinstance(path, str) else path).resolve()
    metadata = path / "metadata"
    if not metadata.is_file():
        raise CheckpointError(
            f"{path} is not a streaming checkpoint (no 'metadata' file). Give the query's "
            "checkpointLocation."
        )
    query_id = str(json.loads(metadata.read_text())["id"])
    planned, committed = batches(path / "offsets"), batches(path / "commits")
    conf: dict[str, str] = {}
    sources: list[Any] = []
    watermark = 0
    continuous = False
    planned_over = ""
    if planned:
        text = (path / "offsets" / str(planned[-1])).read_text()
        batch_metadata, sources = _parsed_offsets(path, planned[-1], text)
        planned_over = planned_offsets(text)
        continuous = batch_metadata is None
        conf = {str(k): str(v) for k, v in (batch_metadata or {}).get("conf", {}).items()}
        watermark = int((batch_metadata or {}).get("batchWatermarkMs", 0))
    return Checkpoint(
        path=path,
        query_id=query_id,
        last_planned=planned[-1] if planned else None,
        last_committed=committed[-1] if committed else None,
        watermark_ms=watermark,
        conf=conf,
        sources=tuple(sources),
        operators=tuple(_operators(path / "state")),
        unfinished=tuple(str(p) for p in unfinished_writes(path)),
        state_format=state_format(path, committed[-1]) if committed else 1,
        continuous=continuous,
        planned_over=planned_over,
    )


def state_format(path: Location, batch: int) -> int:
    """The state checkpoint format ``commits/<batch>`` was written in: 2 when it names the
    state files' ids, else 1."""
    file = path / "commits" / str(batch)
    lines = file.read_text().splitlines()
    try:
        metadata = json.loads(lines[1]) if len(lines) > 1 and lines[1].strip() else {}
    except ValueError:
        raise CheckpointError(f"{file} is not a Spark commit file (its metadata line).") from None
    return 2 if isinstance(metadata, dict) and metadata.get("stateUniqueIds") else 1


def unfinished_writes(path: Location) -> list[Location]:
    """Temporary files of ``offsets/`` and ``commits/`` whose batch file was never renamed
    into place: a write cut short by a crash. Nothing reads them, and removing them is
    safe (the batch was not planned, or not committed, and runs again); but Spark's check
    that a new stateful query's ``offsets/`` is empty counts them, so a query killed while
    writing its first offsets file cannot start again until they are gone."""
    found: list[Location] = []
    for folder in ("offsets", "commits"):
        directory = path / folder
        if not directory.is_dir():
            continue
        names = {p.name for p in directory.iterdir()}
        for name in sorted(names):
            match = UNFINISHED_FILE.match(name)
            if match and match.group(1) not in names:
                found.append(directory / name)
    return found


def remove_unfinished_writes(path: Location) -> list[str]:
    """Delete :func:`unfinished_writes` of the checkpoint at ``path``; their names."""
    removed = unfinished_writes(path)
    for file in removed:
        file.unlink(missing_ok=True)
    return [str(p) for p in removed]


def _operators(state: Location) -> list[OperatorState]:
    if not state.is_dir():
        return []
    found = []
    for operator in sorted((p for p in state.iterdir() if p.name.isdigit()), key=_number):
        partitions = [
            _partition(p) for p in sorted(operator.iterdir(), key=_number) if p.name.isdigit()
        ]
        found.append(OperatorState(int(operator.name), _operator_name(operator), tuple(partitions)))
    return found


def _number(path: Location) -> int:
    return int(path.name) if path.name.isdigit() else -1


def operator_metadata(operator: Location) -> dict[str, Any]:
    """The operator's newest metadata (``_metadata/v2/<batch>`` for transformWithState,
    else ``_metadata/metadata``): a version line, then one JSON object; {} when none."""
    v2 = operator / "_metadata" / "v2"
    written = batches(v2)
    path = v2 / str(written[-1]) if written else operator / "_metadata" / "metadata"
    if not path.is_file():
        return {}
    for line in path.read_text().splitlines()[1:]:
        if line.strip():
            found: dict[str, Any] = json.loads(line)
            return found
    return {}


def _operator_name(operator: Location) -> str:
    return str(operator_metadata(operator).get("operatorInfo", {}).get("operatorName", ""))


def _partition(directory: Location) -> PartitionState:
    files = [f for f in walk_files(directory) if not f.relative.rsplit("/", 1)[-1].startswith(".")]
    versions: dict[int, set[str]] = {}
    for file in files:
        match = STATE_FILE.match(file.relative)
        if match:
            versions.setdefault(int(match.group(1)), set()).add(match.group(2))
    full = [v for v, kinds in versions.items() if kinds & {"zip", "snapshot"}]
    latest_full = max(full) if full else None
    return PartitionState(
        partition=int(directory.name),
        files=len(files),
        bytes=sum(f.size for f in files),
        latest_version=max(versions) if versions else None,
        latest_snapshot=latest_full,
        changelogs_since=sum(
            1
            for v, kinds in versions.items()
            if kinds & {"changelog", "delta"} and (latest_full is None or v > latest_full)
        ),
    )
