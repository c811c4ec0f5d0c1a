"""Savepoints: named, restorable copies of a stopped query's checkpoint (Flink's term).

A savepoint is taken only at a clean boundary (batch N planned and committed) and
holds what a restart after batch N reads: ``offsets/`` and ``commits/`` up to N,
state store versions up to N+1 (version V is the state after batch V-1), operator
metadata up to N, and a ``savepoint.json`` manifest. Files are hard-linked where
the file system allows (Spark never rewrites a checkpoint file in place), copied
elsewhere: on HDFS, S3 or any other store Spark reaches
(:mod:`eos_connectors.ops.locations`), where savepoints may live too.

Restoring copies it into an empty directory:

- **fork** (default): a new query id, so a new sink lineage. The forked query
  restarts at batch N+1 with the savepoint's state; into the old physical target
  it emits everything after the savepoint again (as a Flink job started from a
  savepoint does). A sink whose explicit ``sinkId`` still belongs to the original
  query is refused by the sink at its first batch (the Kafka sink's at its start).
- **resume**: the same query id, allowed only while no sink of that query has
  decided a batch after N; the original checkpoint is then retired (renamed), so
  two queries never share a sink. The sinks checked are those the checkpoint
  itself records (:mod:`eos_connectors.core.checkpoint_sinks`), each in the store and under
  the names it recorded: one that cannot be reached refuses the resume, and so does
  a checkpoint that records none, unless the operator says the query writes to no
  sink of this package (``no_sinks``). So does a query that looks alive: the
  original checkpoint planned a batch after the savepoint, or a sink decided one
  within the last ``quiet_seconds``.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from eos_connectors.core.checkpoint_sinks import FOLDER as SINKS_FOLDER
from eos_connectors.core.checkpoint_sinks import SinkEntry
from eos_connectors.core.errors import keeping_code
from eos_connectors.core.sinks_admin import QUIET_SECONDS, SinkRecord
from eos_connectors.ops.checkpoint import (
    BATCH_FILE,
    STATE_FILE,
    Checkpoint,
    CheckpointError,
    batches,
    read_checkpoint,
    read_offsets,
)
from eos_connectors.ops.locations import (
    Location,
    children,
    copy_files,
    location,
    remove_tree,
    rename,
    walk_files,
)

#: Looks up the bookkeeping of the sinks a checkpoint records, in their own stores; raises
#: CheckpointError naming a sink whose store it cannot reach.
SinkLookup = Callable[[list[SinkEntry]], list[SinkRecord]]

MANIFEST = "savepoint.json"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class Savepoint:
    name: str
    path: str
    query_id: str
    batch: int
    source: str  # the checkpoint it was taken from: an absolute path or a URI
    created: str
    watermark_ms: int
    shuffle_partitions: int | None
    files: int
    bytes: int
    linked: bool  # hard links (cheap) rather than copies

    @classmethod
    def load(cls, directory: Location) -> Savepoint:
        manifest = directory / MANIFEST
        if not manifest.is_file():
            raise CheckpointError(f"{directory} is not a savepoint (no {MANIFEST}).")
        return cls(**{**json.loads(manifest.read_text()), "path": str(directory.resolve())})


def savepoint_root(explicit: str | None = None) -> Location:
    """``--dir``, else ``EOS_SAVEPOINT_DIR``, else ``./savepoints``: a local directory or
    a URI of any file system Spark reaches (``hdfs://...``)."""
    return location(explicit or os.environ.get("EOS_SAVEPOINT_DIR") or "savepoints").resolve()


def create(checkpoint_path: Location | str, name: str, root: Location) -> Savepoint:
    """Savepoint ``name`` of the stopped query at ``checkpoint_path``, under ``root``."""
    if not _NAME.match(name):
        raise CheckpointError(
            f"Savepoint name {name!r}: use letters, digits, '.', '_' and '-' (at most 128)."
        )
    checkpoint = read_checkpoint(checkpoint_path)
    batch = _clean_batch(checkpoint)
    target = root / name
    if target.exists():
        raise CheckpointError(f"Savepoint {name!r} exists already ({target}); pick another name.")
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f".{name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        files, size, linked = _copy_tree(checkpoint.path, partial, _savepoint_keeps(batch))
        if read_checkpoint(checkpoint.path).last_planned != batch:
            raise CheckpointError(
                f"The query of {checkpoint.path} planned a new batch while the savepoint was "
                "taken: stop the query first (query.stop()), then take the savepoint."
            )
        savepoint = Savepoint(
            name=name,
            path=str(target),
            query_id=checkpoint.query_id,
            batch=batch,
            source=str(checkpoint.path),
            created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            watermark_ms=checkpoint.watermark_ms,
            shuffle_partitions=checkpoint.shuffle_partitions,
            files=files,
            bytes=size,
            linked=linked,
        )
        manifest = {k: v for k, v in asdict(savepoint).items() if k != "path"}
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        rename(partial, target)
    finally:
        remove_tree(partial)
    return savepoint


def list_savepoints(root: Location) -> list[Savepoint]:
    if not root.is_dir():
        return []
    found = [Savepoint.load(p) for p in children(root) if (p / MANIFEST).is_file()]
    return sorted(found, key=lambda s: s.created)


def find(root: Location, name: str) -> Savepoint:
    if not (root / name / MANIFEST).is_file():
        known = ", ".join(s.name for s in list_savepoints(root)) or "none"
        raise CheckpointError(f"No savepoint {name!r} under {root} (there: {known}).")
    return Savepoint.load(root / name)


def restore(
    savepoint: Savepoint,
    to: Location | str,
    mode: str = "fork",
    sinks: SinkLookup | None = None,
    no_sinks: bool = False,
    quiet_seconds: float = QUIET_SECONDS,
) -> Checkpoint:
    """A checkpoint at ``to`` (new or empty) that restarts at the savepoint's batch + 1.

    Resume checks the sinks the savepoint's checkpoint records through ``sinks``
    (``eos sinks``'s stores) and refuses when one decided a batch after the savepoint,
    cannot be reached or looks alive; ``no_sinks`` says the query writes to none.
    A fork leaves the record of the original's sinks behind: its sinks record
    themselves under its new query id when it starts.
    """
    if mode not in ("fork", "resume"):
        raise CheckpointError(f"--mode {mode!r}: use fork or resume.")
    to = (location(to) if isinstance(to, str) else to).resolve()
    if to.exists() and any(to.iterdir()):
        raise CheckpointError(f"{to} is not empty: restore into a new or empty directory.")
    if mode == "resume":
        _check_resumable(savepoint, sinks, no_sinks, quiet_seconds)
    source = location(savepoint.path)
    sinks_folder = SINKS_FOLDER.as_posix() + "/"
    _copy_tree(
        source,
        to,
        lambda rel: rel != MANIFEST and (mode == "resume" or not rel.startswith(sinks_folder)),
    )
    _repoint_operator_metadata(to, savepoint.source)
    query_id = savepoint.query_id if mode == "resume" else str(uuid.uuid4())
    _replace(to / "metadata", json.dumps({"id": query_id}))
    origin = {
        "savepoint": savepoint.name,
        "batch": savepoint.batch,
        "mode": mode,
        "origin_query_id": savepoint.query_id,
    }
    _replace(to / "restored-from.json", json.dumps(origin, indent=2) + "\n")
    if mode == "resume":
        _retire(location(savepoint.source), savepoint)
    return read_checkpoint(to)


def _clean_batch(checkpoint: Checkpoint) -> int:
    if checkpoint.last_planned is None:
        raise CheckpointError(f"{checkpoint.path} has no batch yet: nothing to save.")
    if not checkpoint.clean:
        raise CheckpointError(
            f"{checkpoint.path} is not at a clean boundary: batch {checkpoint.last_planned} is "
            f"planned but the last committed one is {checkpoint.last_committed}. Restart the "
            "query until that batch commits, stop it (query.stop()), then take the savepoint."
        )
    assert checkpoint.last_planned is not None
    return checkpoint.last_planned


def _savepoint_keeps(batch: int) -> Callable[[str], bool]:
    """Which files (relative paths) a savepoint at ``batch`` holds."""

    def keep(rel: str) -> bool:
        parts = rel.split("/")
        name = parts[-1]
        if ".tmp" in name:
            return False
        if parts[0] in ("offsets", "commits") and len(parts) == 2:
            found = BATCH_FILE.match(name)
            return found is None or int(found.group(1)) <= batch
        if parts[0] == "state" and "_metadata" in parts and "v2" in parts:
            found = BATCH_FILE.match(name)
            return found is None or int(found.group(1)) <= batch
        if parts[0] == "state" and len(parts) == 4:
            found = STATE_FILE.match(name)
            return found is None or int(found.group(1)) <= batch + 1
        return True

    return keep


def _copy_tree(
    source: Location, target: Location, keep: Callable[[str], bool]
) -> tuple[int, int, bool]:
    """Hard-link (or copy) the files of ``source`` that ``keep`` accepts into ``target``."""
    kept = [entry for entry in walk_files(source) if keep(entry.relative)]
    linked = copy_files([(entry.where, target / entry.relative) for entry in kept])
    target.mkdir(parents=True, exist_ok=True)
    files, size = len(kept), sum(entry.size for entry in kept)
    return files, size, linked


def _replace(path: Location, text: str) -> None:
    """Write ``path`` as a new file (never through a hard link) and drop its checksum."""
    path.unlink(missing_ok=True)
    (path.parent / f".{path.name}.crc").unlink(missing_ok=True)
    path.write_text(text)


def _repoint_operator_metadata(checkpoint: Location, old: str) -> None:
    """transformWithState's operator metadata names its schema files by absolute path."""
    state = checkpoint / "state"
    if not state.is_dir():
        return
    for v2 in state.glob("*/_metadata/v2"):
        for batch in batches(v2):
            path = v2 / str(batch)
            text = path.read_text()
            if old in text:
                _replace(path, text.replace(old, str(checkpoint)))


def _check_resumable(
    savepoint: Savepoint, sinks: SinkLookup | None, no_sinks: bool, quiet_seconds: float
) -> None:
    _check_original_stopped(savepoint)
    recorded = recorded_sinks(location(savepoint.path))
    if not recorded:
        if no_sinks:
            return
        raise CheckpointError(
            f"Savepoint {savepoint.name!r} does not record which sinks its query commits to "
            "(its sinks could not see the checkpoint: set it with .option('checkpointLocation', "
            "...) rather than spark.sql.streaming.checkpointLocation, or an older version ran "
            "it), so resuming cannot prove that no sink decided a later batch. Use --mode "
            "fork, or pass --no-sinks if the query writes to no eos_* sink."
        )
    if no_sinks:
        listed = ", ".join(f"{e.sink_id} in {e.store}" for e in recorded)
        raise CheckpointError(f"--no-sinks, but the checkpoint records sinks: {listed}.")
    if sinks is None:
        raise CheckpointError("--mode resume must check the sinks' bookkeeping in their stores.")
    problems = _resume_problems(savepoint, recorded, sinks(recorded), quiet_seconds)
    if problems:
        raise CheckpointError(
            f"Cannot resume query {savepoint.query_id} from savepoint {savepoint.name!r} "
            f"(batch {savepoint.batch}): {'; '.join(problems)}. Resuming would skip or repeat "
            "batches. Use --mode fork (a new query id and sink lineage) with new sink ids or "
            "targets, or stop the query and wait."
        )


def recorded_sinks(checkpoint: Location) -> list[SinkEntry] | None:
    """The sinks recorded in ``checkpoint`` (:mod:`eos_connectors.core.checkpoint_sinks`),
    None when it records none (an older version of the package ran it, or its sinks
    could not write to the checkpoint's location)."""
    folder = checkpoint / SINKS_FOLDER.as_posix()
    if not folder.is_dir():
        return None
    found = []
    for path in children(folder, "*.json"):
        try:
            raw = json.loads(path.read_text())
            found.append(SinkEntry(**{**raw, "names": dict(raw.get("names", {}))}))
        except (ValueError, TypeError) as exc:
            raise keeping_code(
                CheckpointError(f"{path} is not a sink record of this package: {exc}"), exc
            ) from None
    return found


def _check_original_stopped(savepoint: Savepoint) -> None:
    """The original query planned no batch after the savepoint (else it ran on, or runs)."""
    original = location(savepoint.source)
    if not (original / "metadata").is_file():
        return
    now = read_checkpoint(original)
    if now.query_id == savepoint.query_id and (now.last_planned or 0) > savepoint.batch:
        raise CheckpointError(
            f"Cannot resume from savepoint {savepoint.name!r} (batch {savepoint.batch}): the "
            f"original query at {original} has planned batch {now.last_planned} since, so it "
            "ran on (or is running). Resuming would skip or repeat its batches: use --mode "
            "fork, or take a new savepoint of the stopped query."
        )


def _resume_problems(
    savepoint: Savepoint,
    recorded: list[SinkEntry],
    records: list[SinkRecord],
    quiet_seconds: float,
) -> list[str]:
    found = {(r.store, r.sink_id): r for r in records}
    problems = []
    for entry in recorded:
        record = found.get((entry.store, entry.sink_id))
        if record is None:
            continue  # no bookkeeping left (reset): nothing decided that resuming could skip
        name = f"{entry.sink_id} in {entry.store}"
        if record.last_decided is not None and record.last_decided > savepoint.batch:
            problems.append(
                f"its sinks decided later batches: {name} (batch {record.last_decided})"
            )
        if record.idle_seconds is not None and record.idle_seconds < quiet_seconds:
            problems.append(
                f"{name} decided a batch {record.idle_seconds:.0f} s ago, so the query looks "
                f"alive (give --quiet-seconds below that once you know it is stopped)"
            )
    return problems


def _retire(original: Location, savepoint: Savepoint) -> None:
    """Rename the original checkpoint, so it never runs next to its resumed copy."""
    if not (original / "metadata").is_file():
        return
    if read_checkpoint(original).query_id != savepoint.query_id:
        return
    retired = original.with_name(f"{original.name}.retired-{time.strftime('%Y%m%dT%H%M%S')}")
    rename(original, retired)
    (retired / "RETIRED.txt").write_text(
        f"Retired when savepoint {savepoint.name!r} (batch {savepoint.batch}) was resumed "
        f"elsewhere under the same query id {savepoint.query_id}. Do not start a query on it.\n"
    )


def rescale(
    spark: Any, checkpoint_path: Location | str, partitions: int, root: Location
) -> Savepoint | None:
    """Driver: repartition a stopped query's state to ``partitions``, after a savepoint of
    it; returns the savepoint (None when finishing a rescale whose savepoint is elsewhere).

    Spark's checkpoint manager (4.2+, experimental) writes batch N+1 with the state
    redistributed over the new number of partitions; the query then restarts from
    it with that many shuffle partitions. Exactly-once sinks stay enforced: a failed
    batch is never skipped. A rescale killed after Spark planned that batch leaves a
    checkpoint the query refuses to start on (STREAMING_UNFINISHED_REPARTITION_DETECTED);
    running the same rescale again finishes it, as Spark advises. If anything fails,
    the savepoint is the way back.
    """
    from eos_connectors.core.spark_api import SPARK_MINOR, release

    if SPARK_MINOR < (4, 2):
        raise CheckpointError(
            f"eos checkpoint rescale needs PySpark 4.2 or later (Spark's streaming checkpoint "
            f"manager); PySpark {release()} has none. Run the rescale from a PySpark 4.2+ "
            "environment against the stopped query's checkpoint; nothing was changed."
        )
    checkpoint = read_checkpoint(checkpoint_path)
    if partitions < 1:
        raise CheckpointError(f"--partitions {partitions}: give at least 1.")
    if not checkpoint.operators:
        raise CheckpointError(f"{checkpoint.path} holds no state: nothing to rescale.")
    _check_provider(checkpoint)
    unfinished = _unfinished_rescale(checkpoint)
    if unfinished is not None:
        return _finish_rescale(spark, checkpoint, unfinished, partitions, root)
    if checkpoint.shuffle_partitions == partitions:
        raise CheckpointError(f"{checkpoint.path} already has {partitions} state partitions.")
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    point = create(checkpoint_path, f"before-rescale-{stamp}", root)
    _repartition(spark, checkpoint, partitions, point)
    return point


ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def _check_provider(checkpoint: Checkpoint) -> None:
    """Spark's repartition moves RocksDB state only; refuse any other provider before
    anything is taken or written. The provider is fixed at a query's first start (Spark
    keeps it in the checkpoint), so a query on the default HDFS-backed store cannot be
    switched over either: its state can be rescaled only by reprocessing."""
    provider = checkpoint.conf.get("spark.sql.streaming.stateStore.providerClass", "")
    if provider.endswith("RocksDBStateStoreProvider"):
        return
    name = provider.rsplit(".", 1)[-1] or "the default HDFSBackedStateStoreProvider"
    raise CheckpointError(
        f"{checkpoint.path} keeps its state in {name}; Spark can repartition only state kept "
        "by RocksDBStateStoreProvider, and a query cannot change its provider once started. "
        "Nothing was changed. To run with another number of state partitions, start a new "
        "query (a new checkpoint) with spark.sql.streaming.stateStore.providerClass="
        f"{ROCKSDB_PROVIDER} and the partitions you want, reprocessing its input from the "
        "start (see docs/operations.md)."
    )


def _repartition(
    spark: Any, checkpoint: Checkpoint, partitions: int, point: Savepoint | None
) -> None:
    from eos_connectors.ops.session import using_state_format

    path = checkpoint.path
    way_back = (
        f"Savepoint {point.name!r} holds the query as it was: eos savepoint restore "
        f"{point.name} --to NEW_DIR --mode resume."
        if point is not None
        else "Run the same rescale again to finish it."
    )
    try:
        with using_state_format(spark, checkpoint.state_format):
            spark._streamingCheckpointManager.repartition(str(path), partitions, True)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise keeping_code(
            CheckpointError(f"Spark could not repartition {path}: {first}. {way_back}"), exc
        ) from None
    after = read_checkpoint(path)
    if not after.clean or after.shuffle_partitions != partitions:
        raise CheckpointError(
            f"After repartitioning, {path} has {after.shuffle_partitions} partitions (batch "
            f"{after.last_planned} planned, {after.last_committed} committed). {way_back}"
        )


def _unfinished_rescale(checkpoint: Checkpoint) -> int | None:
    """The partition count of a rescale killed after Spark planned its batch and before
    it committed it (the planned batch changed the count), else None."""
    if checkpoint.clean or checkpoint.last_planned is None or checkpoint.last_planned == 0:
        return None
    previous, _ = read_offsets(checkpoint.path, checkpoint.last_planned - 1)
    before = (previous or {}).get("conf", {}).get("spark.sql.shuffle.partitions")
    if before is None or str(before) == str(checkpoint.shuffle_partitions):
        return None
    return checkpoint.shuffle_partitions


def _finish_rescale(
    spark: Any, checkpoint: Checkpoint, unfinished: int, partitions: int, root: Location
) -> Savepoint | None:
    """Run an interrupted rescale again to the count it was going to; refuse another."""
    taken = [
        p
        for p in list_savepoints(root)
        if p.name.startswith("before-rescale-")
        and p.query_id == checkpoint.query_id
        and p.batch == checkpoint.last_committed
    ]
    point = taken[-1] if taken else None
    if unfinished != partitions:
        back = (
            f"restore savepoint {point.name!r} with --mode resume"
            if point
            else ("restore the before-rescale-... savepoint it took with --mode resume")
        )
        raise CheckpointError(
            f"{checkpoint.path}: a rescale to {unfinished} partitions was interrupted (batch "
            f"{checkpoint.last_planned} planned, not committed). Run it again with "
            f"--partitions {unfinished} to finish it, or {back}."
        )
    _repartition(spark, checkpoint, partitions, point)
    return point
