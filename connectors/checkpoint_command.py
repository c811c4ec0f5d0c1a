"""``eos checkpoint inspect|rescale``, ``eos savepoint create|list|restore``, ``eos state get``.

Sink bookkeeping is read from the stores the environment names (as ``eos sinks``
does: ``EOS_POSTGRES_DSN``, ``EOS_REDIS_URL``, ``EOS_KAFKA_BOOTSTRAP``), so no
password is on a command line; lag is measured against ``EOS_KAFKA_BOOTSTRAP``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from connectors import savepoints, state
from connectors.checkpoint import Checkpoint, CheckpointError, OperatorState, read_checkpoint
from connectors.checkpoint_sinks import SinkEntry
from connectors.errors import ConfigError
from connectors.sinks_admin import QUIET_SECONDS, SinkRecord


def add_checkpoint_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    inspect = actions.add_parser(
        "inspect", help="query id, batches, offsets and lag, watermark, state, sinks"
    )
    inspect.add_argument("path", help="the query's checkpointLocation")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.add_argument(
        "--keys", action="store_true",
        help="also count the keys per operator and partition (starts a local Spark)",
    )  # fmt: skip
    rescale = actions.add_parser(
        "rescale", help="take a savepoint, then repartition a stopped query's state"
    )
    rescale.add_argument("path", help="the query's checkpointLocation")
    rescale.add_argument("--partitions", type=int, required=True, metavar="K")
    rescale.add_argument("--dir", default=None, help="where the savepoint goes (see eos savepoint)")
    _store_arguments(parser)


def add_savepoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", default=None, help="where savepoints live (EOS_SAVEPOINT_DIR, else ./savepoints)"
    )
    actions = parser.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="a named copy of a stopped query's checkpoint")
    create.add_argument("checkpoint")
    create.add_argument("--name", required=True)
    actions.add_parser("list", help="the savepoints, oldest first")
    restore = actions.add_parser("restore", help="a new checkpoint from a savepoint")
    restore.add_argument("name")
    restore.add_argument("--to", required=True, help="a new or empty checkpoint directory")
    restore.add_argument(
        "--mode", choices=["fork", "resume"], default="fork",
        help="fork: a new query id and sink lineage (default); resume: the same query id, "
        "only while no sink the checkpoint records decided a later batch and the query is "
        "stopped; the original checkpoint is retired",
    )  # fmt: skip
    restore.add_argument(
        "--no-sinks", action="store_true",
        help="resume a checkpoint that records no sink: the query writes to no eos_* sink",
    )  # fmt: skip
    restore.add_argument(
        "--quiet-seconds", type=float, default=QUIET_SECONDS, metavar="S",
        help=f"resume refuses while a sink decided a batch less than S seconds ago (the "
        f"query looks alive; default {QUIET_SECONDS:.0f})",
    )  # fmt: skip
    _store_arguments(parser)


def add_state_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    get = actions.add_parser(
        "get", help="a stopped query's keyed state as rows, at its last committed batch"
    )
    get.add_argument("path", nargs="?", help="the query's checkpointLocation")
    get.add_argument("--savepoint", metavar="NAME", help="read this savepoint instead")
    get.add_argument("--dir", default=None, help="where savepoints live (see eos savepoint)")
    get.add_argument("--operator", type=int, metavar="ID", help="needed when there are several")
    get.add_argument("--var", metavar="NAME", help="a transformWithState state variable")
    get.add_argument("--key", metavar="K", help="only the row of this key (a one-field key)")
    get.add_argument("--json", action="store_true", help="one JSON object per row")


def _store_arguments(parser: argparse.ArgumentParser) -> None:
    from connectors.sinks_command import add_store_arguments

    add_store_arguments(parser)


def run_checkpoint(args: argparse.Namespace) -> int:
    if args.action == "rescale":
        return _rescale(args)
    checkpoint = read_checkpoint(Path(args.path))
    report = inspect(checkpoint, _sink_records(args))
    if args.keys:
        with _spark("eos-inspect") as spark:
            add_key_counts(report, state.key_counts(spark, checkpoint))
    print(json.dumps(report, indent=2) if args.json else _text(report))
    return 0


def run_savepoint(args: argparse.Namespace) -> int:
    root = savepoints.savepoint_root(args.dir)
    if args.action == "create":
        made = savepoints.create(Path(args.checkpoint), args.name, root)
        how = "hard links" if made.linked else "copies"
        print(f"Savepoint {made.name} of query {made.query_id} at batch {made.batch}: "
              f"{made.files} files, {made.bytes:,} bytes ({how}) in {made.path}")  # fmt: skip
    elif args.action == "list":
        for point in savepoints.list_savepoints(root):
            print(f"{point.name:<24} batch {point.batch:<6} query {point.query_id}  "
                  f"{point.created}  {point.bytes:,} bytes  from {point.source}")  # fmt: skip
    else:
        point = savepoints.find(root, args.name)
        restored = savepoints.restore(
            point,
            Path(args.to),
            args.mode,
            recorded_sinks,  # asked when resuming
            no_sinks=args.no_sinks,
            quiet_seconds=args.quiet_seconds,
        )
        print(f"Restored {point.name} ({args.mode}) into {restored.path}: query "
              f"{restored.query_id}, next batch {point.batch + 1}")  # fmt: skip
        if args.mode == "resume":
            print(f"The original checkpoint {point.source} was retired (renamed).")
    return 0


def run_state(args: argparse.Namespace) -> int:
    """``eos state get``: rows as a table, or one JSON object per row."""
    point = None
    if args.savepoint is not None:
        point = savepoints.find(savepoints.savepoint_root(args.dir), args.savepoint)
        if args.path is not None:
            _check_same_query(read_checkpoint(Path(args.path)), point)
    elif args.path is None:
        raise ConfigError("eos state get: give the checkpoint PATH, or --savepoint NAME.")
    source = Path(point.path) if point is not None else Path(args.path)
    read = state.plan_read(read_checkpoint(source), args.operator, args.var)  # before Spark
    with state.readable(source, point) as path, _spark("eos-state") as spark:
        frame = state.read_state(spark, replace(read, path=path))
        rows = state.state_rows(frame, args.key)
    if args.json:
        print("\n".join(json.dumps(r, default=str) for r in rows))
    else:
        print(_rows_text(rows))
    if args.key is not None and not rows:
        print(f"No state for key {args.key!r}.", file=sys.stderr)
        return 1
    return 0


def _check_same_query(checkpoint: Checkpoint, point: savepoints.Savepoint) -> None:
    if checkpoint.query_id != point.query_id:
        raise CheckpointError(
            f"Savepoint {point.name!r} is of query {point.query_id}, not of the query at "
            f"{checkpoint.path} ({checkpoint.query_id}). Leave PATH out to read the savepoint."
        )


def _rows_text(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no state)"
    columns = list(dict.fromkeys(c for r in rows for c in r))
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(line.rstrip() for line in lines)


@contextmanager
def _spark(app: str) -> Iterator[Any]:
    """The active session (a notebook's, a test's), else a local one, stopped afterwards."""
    from pyspark.sql import SparkSession

    from connectors.spark import local_session

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    spark = local_session(app=app)
    try:
        yield spark
    finally:
        spark.stop()


def add_key_counts(report: dict[str, Any], counts: dict[int, dict[str, dict[int, int]]]) -> None:
    """Put :func:`state.key_counts` into the report: per operator ``keys`` (total per state
    variable, "" for an operator's one store) and per partition ``keys``."""
    for op in report["operators"]:
        found = counts.get(op["operator"])
        if found is None:
            continue
        op["keys"] = {name: sum(per.values()) for name, per in found.items()}
        for p in op["partitions"]:
            p["keys"] = {name: per.get(p["partition"], 0) for name, per in found.items()}


def _rescale(args: argparse.Namespace) -> int:
    root = savepoints.savepoint_root(args.dir)
    read_checkpoint(Path(args.path))  # a clear error before Spark starts
    with _spark("eos-rescale") as spark:
        point = savepoints.rescale(spark, Path(args.path), args.partitions, root)
    kept = f"savepoint {point.name} holds it as it was, at batch {point.batch}" if point else (
        "its savepoint is under another --dir")  # fmt: skip
    print(f"Rescaled {args.path} to {args.partitions} state partitions ({kept}).")
    return 0


def inspect(checkpoint: Checkpoint, sinks: list[SinkRecord] | None) -> dict[str, Any]:
    """Everything ``eos checkpoint inspect`` shows, as plain data."""
    report: dict[str, Any] = {
        "path": str(checkpoint.path),
        "query_id": checkpoint.query_id,
        "last_planned_batch": checkpoint.last_planned,
        "last_committed_batch": checkpoint.last_committed,
        "clean_boundary": checkpoint.clean,
        "watermark_ms": checkpoint.watermark_ms,
        "shuffle_partitions": checkpoint.shuffle_partitions,
        "sources": [_source(i, offsets) for i, offsets in enumerate(checkpoint.sources)],
        "operators": [_operator(op) for op in checkpoint.operators],
    }
    if sinks is not None:
        report["sinks"] = [
            {"store": r.store, "sink_id": r.sink_id, "target": r.target,
             "last_decided_batch": r.last_decided, "units_in_doubt": len(r.in_doubt),
             "oldest_in_doubt_seconds": r.oldest()}
            for r in sinks
            if r.owner is not None and r.owner.query_id == checkpoint.query_id
        ]  # fmt: skip
    return report


def _operator(op: OperatorState) -> dict[str, Any]:
    return {
        **asdict(op),
        "bytes": op.bytes,
        "current_partitions": op.current_partitions,
        "partitions": [asdict(p) for p in op.partitions],
    }


def _source(index: int, offsets: dict[str, Any] | None) -> dict[str, Any]:
    """A source's end offsets of the last planned batch, with Kafka lag where it is Kafka."""
    if offsets is None or not _kafka_shaped(offsets):
        return {"index": index, "offsets": offsets}
    from sources.kafka.offsets import SourceOffset

    ends = SourceOffset.from_spark(offsets).ends
    entry: dict[str, Any] = {
        "index": index,
        "offsets": {f"{t}-{p}": o for (t, p), o in sorted(ends.items())},
    }
    bootstrap = os.environ.get("EOS_KAFKA_BOOTSTRAP")
    if bootstrap:
        entry["lag"] = _lag(bootstrap, ends)
    return entry


def _kafka_shaped(offsets: dict[str, Any]) -> bool:
    return all(
        isinstance(v, dict) and all(k.isdigit() for k in v)
        for k, v in offsets.items()
        if not k.startswith("@")
    )


def _lag(bootstrap: str, ends: dict[tuple[str, int], int]) -> dict[str, int | None]:
    from connectors.topics import end_offsets

    lag: dict[str, int | None] = {}
    for topic in sorted({t for t, _ in ends}):
        try:
            now = end_offsets(bootstrap, topic)
        except Exception:
            now = {}
        for (t, p), end in sorted(ends.items()):
            if t == topic:
                lag[f"{t}-{p}"] = now[p] - end if p in now else None
    return lag


def _sink_records(args: argparse.Namespace) -> list[SinkRecord] | None:
    """Every store's sink records, or None when the environment names no store."""
    from connectors.sinks_command import admins

    records: list[SinkRecord] = []
    try:
        with admins(args) as found:
            for admin in found:
                records.extend(admin.records())
    except ConfigError:
        return None
    return records


def recorded_sinks(recorded: list[SinkEntry]) -> list[SinkRecord]:
    """The bookkeeping of the sinks a checkpoint records, each read in its own store under
    its own names; CheckpointError when a store is not named by the environment, is
    another one than the checkpoint's, or does not answer."""
    from connectors.sinks_command import store_admin

    records: list[SinkRecord] = []
    for entry in recorded:
        admin = store_admin(entry)
        try:
            records.extend(r for r in admin.records() if r.sink_id == entry.sink_id)
        except Exception as exc:  # any client's error: the store did not answer
            raise CheckpointError(
                f"Could not read sink {entry.sink_id} in {entry.store} at {entry.endpoint}: "
                f"{type(exc).__name__}. Resuming needs every sink the checkpoint records."
            ) from None
        finally:
            admin.close()
    return records


def _keys(entry: dict[str, Any]) -> str:
    """The keys counted: ", keys 10", or ", keys: total 10, seen 10" per state variable."""
    keys = entry.get("keys")
    if not keys:
        return ""
    if list(keys) == [""]:
        return f", keys {keys['']}"
    return ", keys: " + ", ".join(f"{name} {n}" for name, n in keys.items())


def _text(report: dict[str, Any]) -> str:
    lines = [
        f"Checkpoint  {report['path']}",
        f"Query id    {report['query_id']}",
        f"Batches     last planned {report['last_planned_batch']}, last committed "
        f"{report['last_committed_batch']}"
        + ("" if report["clean_boundary"] else " (a batch is in flight or was interrupted)"),
        f"Watermark   {report['watermark_ms']} ms",
        f"Shuffle     {report['shuffle_partitions']} partitions (fixed at the first start)",
    ]
    for source in report["sources"]:
        lines.append(f"Source {source['index']}")
        lag = source.get("lag", {})
        offsets = source["offsets"] or {}
        for name, offset in offsets.items() if isinstance(offsets, dict) else []:
            suffix = f"  lag {lag.get(name)}" if name in lag else ""
            lines.append(f"  {name:<40} {offset}{suffix}")
    for op in report["operators"]:
        lines.append(
            f"Operator {op['operator']} {op['name']}: {op['bytes']:,} bytes, "
            f"{op['current_partitions']} partitions at the newest version{_keys(op)}"
        )
        for p in op["partitions"]:
            lines.append(
                f"  partition {p['partition']:<3} {p['files']} files, {p['bytes']:,} bytes, "
                f"version {p['latest_version']}, snapshot {p['latest_snapshot']}, "
                f"{p['changelogs_since']} changelogs since{_keys(p)}"
            )
    if "sinks" not in report:
        lines.append("Sinks       (set EOS_POSTGRES_DSN / EOS_REDIS_URL / EOS_KAFKA_BOOTSTRAP)")
    for sink in report.get("sinks", []):
        lines.append(
            f"Sink {sink['sink_id']} in {sink['store']} ({sink['target']}): last decided batch "
            f"{sink['last_decided_batch']}, {sink['units_in_doubt']} unit(s) in doubt"
        )
    return "\n".join(lines)
