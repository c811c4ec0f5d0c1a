"""Reading a stopped query's keyed state: ``eos state get`` and inspect's key counts.

Flink's queryable state asks a running job; here the state is read from the
checkpoint (or a savepoint) after the fact, through Spark's ``statestore`` batch
source, at the last committed batch. Everything here runs on the driver of a
batch session of its own and only reads the checkpoint.

A ``transformWithState`` operator keeps one column family per state variable,
and the source reads one at a time (its ``stateVarName`` option): the variables
are listed from the operator's metadata, so a user names one only when there are
several. A stream-stream join keeps four stores per side; reading those is left
to the source itself (``joinSide``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eos_connectors.ops.checkpoint import (
    Checkpoint,
    CheckpointError,
    OperatorState,
    operator_metadata,
)
from eos_connectors.ops.locations import Location

if TYPE_CHECKING:
    from eos_connectors.ops.savepoints import Savepoint

PARTITION_COLUMN = "partition_id"


@dataclass(frozen=True)
class StateRead:
    """What one read of state names: the checkpoint, operator, variable and batch."""

    path: Location
    operator: int
    variable: str | None  # a transformWithState state variable, else None
    batch: int
    state_format: int = 1  # Checkpoint.state_format: the session must be set to it


def state_variables(checkpoint: Location, operator: int) -> list[str]:
    """The state variables of a ``transformWithState`` operator, [] for any other."""
    metadata = operator_metadata(checkpoint / "state" / str(operator))
    properties = json.loads(metadata.get("operatorPropertiesJson") or "{}")
    return [str(v["stateName"]) for v in properties.get("stateVariables", []) if "stateName" in v]


def plan_read(checkpoint: Checkpoint, operator: int | None, variable: str | None) -> StateRead:
    """The read ``eos state get`` makes, or a CheckpointError naming the option to give."""
    if checkpoint.last_committed is None:
        raise CheckpointError(f"{checkpoint.path} has no committed batch: no state to read yet.")
    found = {op.operator: op for op in checkpoint.operators}
    if not found:
        raise CheckpointError(f"{checkpoint.path} holds no state (a stateless query).")
    if operator is None:
        if len(found) > 1:
            raise CheckpointError(
                f"{checkpoint.path} has {len(found)} stateful operators: give --operator, one "
                f"of {_operators(found)}."
            )
        operator = next(iter(found))
    if operator not in found:
        raise CheckpointError(
            f"--operator {operator}: {checkpoint.path} has operators {_operators(found)}."
        )
    if _is_join(found[operator]):
        raise CheckpointError(
            f"Operator {operator} is a stream-stream join; read its sides with Spark's "
            "statestore source and its joinSide option."
        )
    names = state_variables(checkpoint.path, operator)
    variable = _variable(operator, names, variable)
    batch = checkpoint.last_committed
    return StateRead(checkpoint.path, operator, variable, batch, checkpoint.state_format)


def _is_join(op: OperatorState) -> bool:
    """A stream-stream join: four stores per side, read through the source's joinSide."""
    return "join" in op.name.lower()


def _operators(found: dict[int, OperatorState]) -> str:
    return ", ".join(f"{op.operator} ({op.name or 'unnamed'})" for op in found.values())


def _variable(operator: int, names: list[str], variable: str | None) -> str | None:
    if not names:
        if variable is not None:
            raise CheckpointError(
                f"--var {variable}: operator {operator} is not a transformWithState operator "
                "and has no state variables; leave --var out."
            )
        return None
    if variable is None and len(names) == 1:
        return names[0]
    if variable not in names:
        given = f"--var {variable} is not one of them" if variable else "give --var"
        raise CheckpointError(
            f"Operator {operator} keeps state variables {', '.join(names)}: {given}."
        )
    return variable


def read_state(spark: Any, read: StateRead) -> Any:
    """Driver: the state as a DataFrame (``key``, the value columns, ``partition_id``)."""
    reader = (
        spark.read.format("statestore")
        .option("path", str(read.path))
        .option("operatorId", read.operator)
        .option("batchId", read.batch)
    )
    if read.variable is not None:
        reader = reader.option("stateVarName", read.variable)
    return reader.load()


def state_rows(frame: Any, key: str | None = None) -> list[dict[str, Any]]:
    """Driver: the state's rows as flat dicts (struct fields by their own names where
    unique), sorted by key; ``key`` keeps the rows whose single key field equals it."""
    if key is not None:
        frame = frame.where(_key_filter(frame, key))
    flat = [_flatten(row.asDict(recursive=True)) for row in frame.collect()]
    return sorted(flat, key=lambda r: json.dumps(r, sort_keys=True, default=str))


def _key_filter(frame: Any, key: str) -> Any:
    from pyspark.sql import functions as F

    fields = frame.schema["key"].dataType.fieldNames()
    if len(fields) != 1:
        raise CheckpointError(
            f"--key: this state's key has {len(fields)} fields ({', '.join(fields)}); --key "
            "matches a one-field key. Filter the rows of `eos state get --json` instead."
        )
    return F.col(f"key.{fields[0]}").cast("string") == key


def _flatten(row: dict[str, Any]) -> dict[str, Any]:
    parts: dict[str, Any] = {}
    for column, value in row.items():
        if isinstance(value, dict):
            parts.update({f"{column}.{k}": v for k, v in value.items()})
        else:
            parts[column] = value
    short = [name.split(".", 1)[-1] for name in parts]
    return {
        (s if short.count(s) == 1 else name): value
        for name, s, value in zip(parts, short, parts.values(), strict=True)
    }


def key_counts(spark: Any, checkpoint: Checkpoint) -> dict[int, dict[str, dict[int, int]]]:
    """Driver: per operator, per state variable ("" for an operator's one store), the
    number of keys in each partition at the last committed batch (a list variable's
    elements count once per key). Joins are left out."""
    counts: dict[int, dict[str, dict[int, int]]] = {}
    if checkpoint.last_committed is None:
        return counts
    for op in checkpoint.operators:
        if _is_join(op):
            continue
        names: list[str | None] = [*state_variables(checkpoint.path, op.operator)] or [None]
        counts[op.operator] = {}
        for name in names:
            read = StateRead(
                checkpoint.path,
                op.operator,
                name,
                checkpoint.last_committed,
                checkpoint.state_format,
            )
            keys = read_state(spark, read).select("key", PARTITION_COLUMN).distinct()
            grouped = keys.groupBy(PARTITION_COLUMN).count().collect()
            counts[op.operator][name or ""] = {int(r[0]): int(r[1]) for r in grouped}
    return counts


@contextmanager
def readable(checkpoint: Location, savepoint: Savepoint | None) -> Iterator[Location]:
    """The directory to read state from: the checkpoint itself, or a savepoint restored
    into a throw-away local directory (hard links, or copies from a shared store; the
    savepoint is never written to)."""
    if savepoint is None:
        yield checkpoint
        return
    from eos_connectors.ops.savepoints import restore

    with tempfile.TemporaryDirectory(prefix="eos-state-") as scratch:
        yield restore(savepoint, Path(scratch) / "checkpoint", "fork").path
