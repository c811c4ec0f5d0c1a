"""``eos sinks``: list, show, settle and reset sink ids in PostgreSQL, Redis and Kafka.

Stores come from the environment only (see :mod:`eos_connectors.ops.stores`), so no
password is ever on a command line.

``reset`` must know that the owning query can never replay a batch whose
bookkeeping it forgets: give the query's checkpoint (``--checkpoint``: the sink
must belong to its query, and hold no decision past its last committed batch,
which must be committed) or say it is gone (``--checkpoint-deleted``). A sink
that decided a batch within ``--quiet-seconds`` is taken for a running query's.
"""

from __future__ import annotations

import argparse
import sys

from eos_connectors.core.sinks_admin import (
    QUIET_SECONDS,
    ResetGuard,
    SinkAdmin,
    SinkAdminError,
    SinkRecord,
)
from eos_connectors.ops.stores import BookkeepingNames, admins, reset_guard


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="every sink id with its query, last batch, units in doubt")
    for action, text in [
        ("show", "one sink id's owner and each unit in doubt with its age"),
        ("settle", "commit what its decisions name, roll back the rest (its query is gone)"),
        ("reset", "forget a settled sink id's bookkeeping, so a new query can claim it"),
    ]:
        one = actions.add_parser(action, help=text)
        one.add_argument("sink_id", help="the sink id, as `eos sinks list` shows it")
        if action == "reset":
            _reset_arguments(one)
    add_store_arguments(parser)


def _reset_arguments(parser: argparse.ArgumentParser) -> None:
    gone = parser.add_mutually_exclusive_group(required=True)
    gone.add_argument(
        "--checkpoint",
        metavar="PATH",
        help="the owning query's checkpointLocation: its last batch must be committed, and "
        "the sink may hold no decision past it",
    )
    gone.add_argument(
        "--checkpoint-deleted",
        action="store_true",
        help="the owning query's checkpoint is deleted for good, so it can replay nothing",
    )
    parser.add_argument(
        "--quiet-seconds",
        type=float,
        default=QUIET_SECONDS,
        metavar="S",
        help=f"refuse while the sink decided a batch less than S seconds ago (a running "
        f"query decides every batch; default {QUIET_SECONDS:.0f})",
    )
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """Where each sink keeps its bookkeeping, when not at the default."""
    defaults = BookkeepingNames()
    for option, default, text in [
        ("--bookkeeping-schema", defaults.bookkeeping_schema, "eos_postgres's bookkeepingSchema"),
        ("--bookkeeping-prefix", defaults.bookkeeping_prefix, "eos_redis's bookkeepingPrefix"),
        (
            "--transactional-id-prefix",
            defaults.transactional_id_prefix,
            "eos_kafka's transactionalIdPrefix",
        ),
        ("--marker-log-topic", defaults.marker_log_topic, "eos_kafka's markerLogTopic"),
    ]:
        parser.add_argument(option, default=default, help=f"{text} (default {default})")


def names_of(args: argparse.Namespace) -> BookkeepingNames:
    return BookkeepingNames(
        args.bookkeeping_schema,
        args.bookkeeping_prefix,
        args.transactional_id_prefix,
        args.marker_log_topic,
    )


def run(args: argparse.Namespace) -> int:
    guard = None
    if args.action == "reset":
        path = None if args.checkpoint_deleted else args.checkpoint
        guard = reset_guard(path, args.quiet_seconds)
    with admins(names_of(args)) as stores:
        if args.action == "list":
            return _list(stores)
        owning = [a for a in stores if a.find(args.sink_id) is not None]
        if not owning:
            raise SinkAdminError(f"No sink {args.sink_id!r} in {_names(stores)}.")
        for admin in owning:
            _act(admin, args, guard)
    return 0


def _act(admin: SinkAdmin, args: argparse.Namespace, guard: ResetGuard | None) -> None:
    if args.action == "show":
        _show(admin.record(args.sink_id))
    elif args.action == "settle":
        settled = admin.settle(args.sink_id)
        print(
            f"{admin.store} {args.sink_id}: committed {len(settled.committed)} unit(s), "
            f"rolled back {len(settled.rolled_back)}"
        )
    elif args.action == "reset":
        if not args.yes and not _confirm(f"Forget sink {args.sink_id} in {admin.store}?"):
            print("nothing changed")
            return
        assert guard is not None
        admin.reset(args.sink_id, guard)
        print(f"{admin.store} {args.sink_id}: bookkeeping forgotten")


def _list(stores: list[SinkAdmin]) -> int:
    print(
        f"{'store':<9} {'sink id':<28} {'query':<38} {'last batch':>10} "
        f"{'in doubt':>8} {'oldest':>9}  target"
    )
    for admin in stores:
        for r in admin.records():
            query = r.owner.query_id if r.owner else "-"
            last = "-" if r.last_decided is None else str(r.last_decided)
            oldest = "-" if r.oldest() is None else f"{r.oldest():.0f} s"
            print(
                f"{r.store:<9} {r.sink_id:<28} {query:<38} {last:>10} {len(r.in_doubt):>8} "
                f"{oldest:>9}  {r.target or '-'}"
            )
    return 0


def _show(record: SinkRecord) -> None:
    owner = record.owner
    print(f"sink {record.sink_id} in {record.store}")
    print(f"  query       {owner.query_id if owner else '(none recorded)'}")
    if owner and owner.origin:
        print(f"  restored    {owner.origin}")
    print(f"  target      {record.target or '(unknown)'}")
    print(f"  last batch  {'-' if record.last_decided is None else record.last_decided}")
    print(f"  in doubt    {len(record.in_doubt)}")
    for unit in record.in_doubt:
        age = "?" if unit.age_seconds is None else f"{unit.age_seconds:.0f} s"
        print(f"    {unit.unit}  ({age})")


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise SinkAdminError("Not a terminal: pass --yes to confirm the reset.")
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _names(stores: list[SinkAdmin]) -> str:
    return ", ".join(a.store for a in stores)
