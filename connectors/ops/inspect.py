"""What ``eos checkpoint inspect`` shows: a checkpoint's identity, batches, sources (with
Kafka lag), state and sinks, as plain data and as text. Driver-side tooling.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any

from eos_connectors.core.checkpoint_behind import replanned_over
from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.sinks_admin import SinkRecord
from eos_connectors.ops.checkpoint import Checkpoint, OperatorState


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
        "unfinished_writes": list(checkpoint.unfinished),
        "continuous_processing": checkpoint.continuous,
    }
    if sinks is not None:
        report["sinks"] = [
            {
                "store": r.store,
                "sink_id": r.sink_id,
                "target": r.target,
                "last_decided_batch": r.last_decided,
                "ahead_of_checkpoint": _ahead(r.last_decided, checkpoint.last_planned),
                "replanned": _replanned(r, checkpoint),
                "units_in_doubt": len(r.in_doubt),
                "oldest_in_doubt_seconds": r.oldest(),
            }
            for r in sinks
            if r.owner is not None and r.owner.query_id == checkpoint.query_id
        ]
    return report


def _ahead(decided: int | None, planned: int | None) -> bool:
    """Whether a sink decided a batch past the checkpoint's last planned one: the checkpoint
    is an older copy, and a restart is refused (``core.checkpoint_behind``)."""
    return decided is not None and decided > (-1 if planned is None else planned)


def _replanned(record: SinkRecord, checkpoint: Checkpoint) -> bool:
    """Whether the sink decided the checkpoint's last planned batch over other source
    positions than the checkpoint plans for it now: the checkpoint was put back by one
    batch and replanned it, and the batch's commit is refused. Unknown (a store that keeps
    no positions, a decision written before they were kept) is not flagged."""
    return (
        record.last_decided is not None
        and record.last_decided == checkpoint.last_planned
        and replanned_over(record.last_offsets, checkpoint.planned_over)
    )


def _operator(op: OperatorState) -> dict[str, Any]:
    return {
        **asdict(op),
        "bytes": op.bytes,
        "current_partitions": op.current_partitions,
        "partitions": [asdict(p) for p in op.partitions],
    }


def _source(index: int, offsets: Any) -> dict[str, Any]:
    """A source's end offsets of the last planned batch, as the source wrote them (any
    JSON value), with Kafka lag where it is Kafka."""
    if not isinstance(offsets, dict) or not _kafka_shaped(offsets):
        return {"index": index, "offsets": offsets}
    from eos_connectors.sources.kafka.offsets import SourceOffset

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
    from eos_connectors.core.topics import end_offsets

    lag: dict[str, int | None] = {}
    for topic in sorted({t for t, _ in ends}):
        try:
            now = end_offsets(plaintext(bootstrap), topic)
        except Exception:
            now = {}
        for (t, p), end in sorted(ends.items()):
            if t == topic:
                lag[f"{t}-{p}"] = now[p] - end if p in now else None
    return lag


def _keys(entry: dict[str, Any]) -> str:
    """The keys counted: ", keys 10", or ", keys: total 10, seen 10" per state variable."""
    keys = entry.get("keys")
    if not keys:
        return ""
    if list(keys) == [""]:
        return f", keys {keys['']}"
    return ", keys: " + ", ".join(f"{name} {n}" for name, n in keys.items())


def report_text(report: dict[str, Any]) -> str:
    lines = [
        f"Checkpoint  {report['path']}",
        f"Query id    {report['query_id']}",
        f"Batches     last planned {report['last_planned_batch']}, last committed "
        f"{report['last_committed_batch']}"
        + ("" if report["clean_boundary"] else " (a batch is in flight or was interrupted)"),
        f"Watermark   {report['watermark_ms']} ms",
        f"Shuffle     {report['shuffle_partitions']} partitions (fixed at the first start)",
    ]
    if report["continuous_processing"]:
        lines.append(
            "Trigger     the last offsets were written under continuous processing, where "
            "Spark hands a Python sink no rows; this package's sinks refuse it "
            "(docs/operations.md)"
        )
    if report["unfinished_writes"]:
        lines.append(
            f"Unfinished {len(report['unfinished_writes'])} batch write(s) a crash cut short; "
            "a new stateful query cannot start with them in offsets/: eos checkpoint clean"
        )
    for source in report["sources"]:
        lines.append(f"Source {source['index']}")
        lag = source.get("lag", {})
        offsets = source["offsets"]
        if offsets is not None and not isinstance(offsets, dict):  # not Kafka: as written
            lines.append(f"  offset {json.dumps(offsets)}")
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
        if sink.get("ahead_of_checkpoint"):
            lines.append(
                "  past this checkpoint's last planned batch: the checkpoint is older than the "
                "sink (a copy put back, or offsets deleted), and a restart is refused; see "
                "docs/operations.md#a-checkpoint-restored-from-an-older-copy"
            )
        if sink.get("replanned"):
            lines.append(
                f"  decided batch {sink['last_decided_batch']} over other source positions "
                "than this checkpoint plans for it now: the checkpoint was put back by one "
                "batch (its last offsets files deleted, or an older copy) and Spark planned "
                "that batch again, and a restart is refused; see "
                "docs/operations.md#a-checkpoint-restored-from-an-older-copy"
            )
    return "\n".join(lines)
