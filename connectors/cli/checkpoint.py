"""``eos checkpoint inspect|clean|rescale``: a streaming query's checkpoint.

Sink bookkeeping is read from the stores the environment names (see
:mod:`eos_connectors.ops.stores`); lag is measured against ``EOS_KAFKA_BOOTSTRAP``.
"""

from __future__ import annotations

import argparse
import json

from eos_connectors.cli.sinks import add_store_arguments, names_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    inspect = actions.add_parser(
        "inspect", help="query id, batches, offsets and lag, watermark, state, sinks"
    )
    inspect.add_argument("path", help="the query's checkpointLocation")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    inspect.add_argument(
        "--keys",
        action="store_true",
        help="also count the keys per operator and partition (starts a local Spark)",
    )
    clean = actions.add_parser(
        "clean",
        help="remove the temporary files of batch writes a crash cut short (a query killed "
        "while writing its first offsets file cannot start again until they are gone)",
    )
    clean.add_argument("path", help="the query's checkpointLocation")
    rescale = actions.add_parser(
        "rescale", help="take a savepoint, then repartition a stopped query's state"
    )
    rescale.add_argument("path", help="the query's checkpointLocation")
    rescale.add_argument(
        "--partitions",
        type=int,
        required=True,
        metavar="K",
        help="the number of state partitions (spark.sql.shuffle.partitions) to move to",
    )
    rescale.add_argument(
        "--dir",
        default=None,
        help="where the savepoint taken first goes (EOS_SAVEPOINT_DIR, else ./savepoints)",
    )
    add_store_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from eos_connectors.ops import inspect, state
    from eos_connectors.ops.checkpoint import read_checkpoint
    from eos_connectors.ops.locations import location
    from eos_connectors.ops.session import tool_session, using_state_format
    from eos_connectors.ops.stores import all_records

    if args.action == "rescale":
        return _rescale(args)
    if args.action == "clean":
        from eos_connectors.ops.checkpoint import remove_unfinished_writes

        read_checkpoint(args.path)  # a clear error for a directory that is no checkpoint
        removed = remove_unfinished_writes(location(args.path))
        print("\n".join(f"removed {p}" for p in removed) or "Nothing to remove.")
        return 0
    checkpoint = read_checkpoint(args.path)
    report = inspect.inspect(checkpoint, all_records(names_of(args)))
    if args.keys:
        with (
            tool_session("eos-inspect") as spark,
            using_state_format(spark, checkpoint.state_format),
        ):
            inspect.add_key_counts(report, state.key_counts(spark, checkpoint))
    print(json.dumps(report, indent=2) if args.json else inspect.report_text(report))
    return 0


def _rescale(args: argparse.Namespace) -> int:
    from eos_connectors.ops import savepoints
    from eos_connectors.ops.checkpoint import read_checkpoint
    from eos_connectors.ops.session import tool_session

    root = savepoints.savepoint_root(args.dir)
    read_checkpoint(args.path)  # a clear error before Spark starts
    with tool_session("eos-rescale") as spark:
        point = savepoints.rescale(spark, args.path, args.partitions, root)
    kept = (
        f"savepoint {point.name} holds it as it was, at batch {point.batch}"
        if point
        else ("its savepoint is under another --dir")
    )
    print(f"Rescaled {args.path} to {args.partitions} state partitions ({kept}).")
    return 0
