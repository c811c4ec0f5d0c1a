"""``eos state get``: a stopped query's keyed state (or a savepoint's) as rows."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from typing import Any

from eos_connectors.core.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    get = actions.add_parser(
        "get", help="a stopped query's keyed state as rows, at its last committed batch"
    )
    get.add_argument("path", nargs="?", help="the query's checkpointLocation")
    get.add_argument("--savepoint", metavar="NAME", help="read this savepoint instead")
    get.add_argument("--dir", default=None, help="where savepoints live (see eos savepoint)")
    get.add_argument(
        "--operator", type=int, metavar="ID", help="the stateful operator, when there are several"
    )
    get.add_argument("--var", metavar="NAME", help="a transformWithState state variable")
    get.add_argument("--key", metavar="K", help="only the row of this key (a one-field key)")
    get.add_argument("--json", action="store_true", help="one JSON object per row")


def run(args: argparse.Namespace) -> int:
    """``eos state get``: rows as a table, or one JSON object per row."""
    from eos_connectors.ops import savepoints, state
    from eos_connectors.ops.checkpoint import read_checkpoint
    from eos_connectors.ops.locations import location
    from eos_connectors.ops.session import tool_session, using_state_format

    point = None
    if args.savepoint is not None:
        point = savepoints.find(savepoints.savepoint_root(args.dir), args.savepoint)
        if args.path is not None:
            _check_same_query(read_checkpoint(args.path), point)
    elif args.path is None:
        raise ConfigError("eos state get: give the checkpoint PATH, or --savepoint NAME.")
    source = location(point.path if point is not None else args.path)
    read = state.plan_read(read_checkpoint(source), args.operator, args.var)  # before Spark
    with (
        state.readable(source, point) as path,
        tool_session("eos-state") as spark,
        using_state_format(spark, read.state_format),
    ):
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


def _check_same_query(checkpoint: Any, point: Any) -> None:
    if checkpoint.query_id != point.query_id:
        raise ConfigError(
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
