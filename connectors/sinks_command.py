"""``eos sinks``: list, show, settle and reset sink ids in PostgreSQL, Redis and Kafka.

Stores come from the environment only (``EOS_POSTGRES_DSN``, ``EOS_REDIS_URL``,
``EOS_KAFKA_BOOTSTRAP``; ``eval "$(eos stack env)"`` sets them for the local
stack), so no password is ever on a command line; a store whose variable is
unset is skipped.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from connectors.errors import ConfigError
from connectors.sinks_admin import SinkAdmin, SinkAdminError, SinkRecord


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every sink id with its query, last batch, units in doubt")
    for action, text in [
        ("show", "one sink id's owner and each unit in doubt with its age"),
        ("settle", "commit what its decisions name, roll back the rest (its query is gone)"),
        ("reset", "forget a settled sink id's bookkeeping, so a new query can claim it"),
    ]:
        one = actions.add_parser(action, help=text)
        one.add_argument("sink_id")
        if action == "reset":
            one.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    add_store_arguments(parser)


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    """Where each sink keeps its bookkeeping, when not at the default."""
    for option, default, text in [
        ("--bookkeeping-schema", "eos", "eos_postgres's bookkeepingSchema"),
        ("--bookkeeping-prefix", "eos", "eos_redis's bookkeepingPrefix"),
        ("--transactional-id-prefix", "eos", "eos_kafka's transactionalIdPrefix"),
        ("--marker-log-topic", "eos-sink-markers", "eos_kafka's markerLogTopic"),
    ]:
        parser.add_argument(option, default=default, help=text)


@contextmanager
def admins(args: argparse.Namespace) -> Iterator[list[SinkAdmin]]:
    """A SinkAdmin per store the environment names."""
    found: list[SinkAdmin] = []
    if os.environ.get("EOS_POSTGRES_DSN"):
        from sinks.postgres.admin import PostgresSinkAdmin

        found.append(PostgresSinkAdmin(os.environ["EOS_POSTGRES_DSN"], args.bookkeeping_schema))
    if os.environ.get("EOS_REDIS_URL"):
        from sinks.redis.admin import RedisSinkAdmin

        found.append(RedisSinkAdmin(os.environ["EOS_REDIS_URL"], args.bookkeeping_prefix))
    if os.environ.get("EOS_KAFKA_BOOTSTRAP"):
        from sinks.kafka.admin import KafkaSinkAdmin

        config = {"bootstrap.servers": os.environ["EOS_KAFKA_BOOTSTRAP"]}
        found.append(KafkaSinkAdmin(config, args.transactional_id_prefix, args.marker_log_topic))
    if not found:
        raise ConfigError(
            "No store to look in: set EOS_POSTGRES_DSN, EOS_REDIS_URL and/or "
            'EOS_KAFKA_BOOTSTRAP (for the local stack: eval "$(eos stack env)").'
        )
    try:
        yield found
    finally:
        for admin in found:
            admin.close()


def run(args: argparse.Namespace) -> int:
    with admins(args) as stores:
        if args.action == "list":
            return _list(stores)
        owning = [a for a in stores if args.sink_id in {r.sink_id for r in a.records()}]
        if not owning:
            raise SinkAdminError(f"No sink {args.sink_id!r} in {_names(stores)}.")
        for admin in owning:
            _act(admin, args)
    return 0


def _act(admin: SinkAdmin, args: argparse.Namespace) -> None:
    if args.action == "show":
        _show(admin.record(args.sink_id))
    elif args.action == "settle":
        settled = admin.settle(args.sink_id)
        print(f"{admin.store} {args.sink_id}: committed {len(settled.committed)} unit(s), "
              f"rolled back {len(settled.rolled_back)}")  # fmt: skip
    elif args.action == "reset":
        if not args.yes and not _confirm(f"Forget sink {args.sink_id} in {admin.store}?"):
            print("nothing changed")
            return
        admin.reset(args.sink_id)
        print(f"{admin.store} {args.sink_id}: bookkeeping forgotten")


def _list(stores: list[SinkAdmin]) -> int:
    print(f"{'store':<9} {'sink id':<28} {'query':<38} {'last batch':>10} "
          f"{'in doubt':>8} {'oldest':>9}  target")  # fmt: skip
    for admin in stores:
        for r in admin.records():
            query = r.owner.query_id if r.owner else "-"
            last = "-" if r.last_decided is None else str(r.last_decided)
            oldest = "-" if r.oldest() is None else f"{r.oldest():.0f} s"
            print(f"{r.store:<9} {r.sink_id:<28} {query:<38} {last:>10} {len(r.in_doubt):>8} "
                  f"{oldest:>9}  {r.target or '-'}")  # fmt: skip
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
