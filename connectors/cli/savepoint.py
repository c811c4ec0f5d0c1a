"""``eos savepoint create|list|restore``: named copies of a stopped query's checkpoint."""

from __future__ import annotations

import argparse

from eos_connectors.cli.sinks import add_store_arguments
from eos_connectors.core.sinks_admin import QUIET_SECONDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir", default=None, help="where savepoints live (EOS_SAVEPOINT_DIR, else ./savepoints)"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="a named copy of a stopped query's checkpoint")
    create.add_argument("checkpoint", help="the stopped query's checkpointLocation")
    create.add_argument(
        "--name", required=True, help="the savepoint's name: letters, digits, '.', '_', '-'"
    )
    actions.add_parser("list", help="the savepoints, oldest first")
    restore = actions.add_parser("restore", help="a new checkpoint from a savepoint")
    restore.add_argument("name", help="the savepoint's name, as `eos savepoint list` shows it")
    restore.add_argument("--to", required=True, help="a new or empty checkpoint directory")
    restore.add_argument(
        "--mode",
        choices=["fork", "resume"],
        default="fork",
        help="fork: a new query id and sink lineage (default); resume: the same query id, "
        "only while no sink the checkpoint records decided a later batch and the query is "
        "stopped; the original checkpoint is retired",
    )
    restore.add_argument(
        "--no-sinks",
        action="store_true",
        help="resume a checkpoint that records no sink: the query writes to no eos_* sink",
    )
    restore.add_argument(
        "--quiet-seconds",
        type=float,
        default=QUIET_SECONDS,
        metavar="S",
        help=f"resume refuses while a sink decided a batch less than S seconds ago (the "
        f"query looks alive; default {QUIET_SECONDS:.0f})",
    )
    add_store_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from eos_connectors.ops import savepoints
    from eos_connectors.ops.stores import recorded_sinks

    root = savepoints.savepoint_root(args.dir)
    if args.action == "create":
        made = savepoints.create(args.checkpoint, args.name, root)
        how = "hard links" if made.linked else "copies"
        print(
            f"Savepoint {made.name} of query {made.query_id} at batch {made.batch}: "
            f"{made.files} files, {made.bytes:,} bytes ({how}) in {made.path}"
        )
    elif args.action == "list":
        for point in savepoints.list_savepoints(root):
            print(
                f"{point.name:<24} batch {point.batch:<6} query {point.query_id}  "
                f"{point.created}  {point.bytes:,} bytes  from {point.source}"
            )
    else:
        point = savepoints.find(root, args.name)
        restored = savepoints.restore(
            point,
            args.to,
            args.mode,
            recorded_sinks,  # asked when resuming
            no_sinks=args.no_sinks,
            quiet_seconds=args.quiet_seconds,
        )
        print(
            f"Restored {point.name} ({args.mode}) into {restored.path}: query "
            f"{restored.query_id}, next batch {point.batch + 1}"
        )
        if args.mode == "resume":
            print(f"The original checkpoint {point.source} was retired (renamed).")
    return 0
