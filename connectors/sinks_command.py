"""``eos sinks``: list, show, settle and reset sink ids in PostgreSQL, Redis and Kafka.

Stores come from the environment only (``EOS_POSTGRES_DSN``, ``EOS_REDIS_URL``,
``EOS_KAFKA_BOOTSTRAP``; ``eval "$(eos stack env)"`` sets them for the local
stack), so no password is ever on a command line; a store whose variable is
unset is skipped. A Kafka cluster behind SASL or TLS takes its client settings
from the file ``EOS_KAFKA_CONFIG`` names (``key=value`` lines of librdkafka
settings, as ``kafka.*`` options without the prefix: ``security.protocol``,
``sasl.mechanism``, ``sasl.username``, ``sasl.password``, ``ssl.ca.location``...).

``reset`` must know that the owning query can never replay a batch whose
bookkeeping it forgets: give the query's checkpoint (``--checkpoint``: the sink
must belong to its query, and hold no decision past its last committed batch,
which must be committed) or say it is gone (``--checkpoint-deleted``). A sink
that decided a batch within ``--quiet-seconds`` is taken for a running query's.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from connectors.checkpoint_sinks import SinkEntry
from connectors.errors import ConfigError
from connectors.sinks_admin import QUIET_SECONDS, ResetGuard, SinkAdmin, SinkAdminError, SinkRecord


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", required=True)
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
        "--checkpoint", metavar="PATH",
        help="the owning query's checkpointLocation: its last batch must be committed, and "
        "the sink may hold no decision past it",
    )  # fmt: skip
    gone.add_argument(
        "--checkpoint-deleted", action="store_true",
        help="the owning query's checkpoint is deleted for good, so it can replay nothing",
    )  # fmt: skip
    parser.add_argument(
        "--quiet-seconds", type=float, default=QUIET_SECONDS, metavar="S",
        help=f"refuse while the sink decided a batch less than S seconds ago (a running "
        f"query decides every batch; default {QUIET_SECONDS:.0f})",
    )  # fmt: skip
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def reset_guard(args: argparse.Namespace) -> ResetGuard:
    """What ``eos sinks reset`` checks, from the owning query's checkpoint."""
    if args.checkpoint_deleted:
        return ResetGuard(None, None, args.quiet_seconds)
    from connectors.checkpoint import read_checkpoint

    checkpoint = read_checkpoint(Path(args.checkpoint))
    if not checkpoint.clean:
        raise SinkAdminError(
            f"Not resetting: {checkpoint.path} planned batch {checkpoint.last_planned} but "
            f"committed only {checkpoint.last_committed}, so its query replays that batch when "
            "it restarts, and the replay needs the sink's bookkeeping to write it once. "
            "Restart the query until the batch commits, stop it, then reset."
        )
    return ResetGuard(checkpoint.query_id, checkpoint.last_committed, args.quiet_seconds)


def kafka_client_config() -> dict[str, str]:
    """``EOS_KAFKA_BOOTSTRAP`` with the settings of the file ``EOS_KAFKA_CONFIG`` names."""
    config: dict[str, str] = {}
    path = os.environ.get("EOS_KAFKA_CONFIG")
    if path:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise ConfigError(
                f"EOS_KAFKA_CONFIG names {path}, which cannot be read: {exc}."
            ) from None
        for number, line in enumerate(lines, 1):
            text = line.strip()
            if not text or text.startswith(("#", "!")):
                continue
            key, sep, value = text.partition("=")
            if not sep:
                raise ConfigError(f"{path} line {number}: expected key=value.")
            config[key.strip().removeprefix("kafka.")] = value.strip()
    config["bootstrap.servers"] = os.environ["EOS_KAFKA_BOOTSTRAP"]
    return config


def store_admin(entry: SinkEntry) -> SinkAdmin:
    """The admin of the store a checkpoint recorded ``entry`` in, under its names; the
    connection (with its credentials) from the environment, which must name that store."""
    from connectors.checkpoint import CheckpointError
    from connectors.checkpoint_sinks import postgres_endpoint, redis_endpoint

    variable = _STORE_VARIABLES[entry.store]
    value = os.environ.get(variable)
    if not value:
        raise CheckpointError(
            f"The checkpoint records sink {entry.sink_id} in {entry.store} at {entry.endpoint}: "
            f"set {variable} to reach it."
        )
    where = {"postgres": postgres_endpoint, "redis": redis_endpoint}.get(entry.store, str)(value)
    if where != entry.endpoint:
        raise CheckpointError(
            f"The checkpoint records sink {entry.sink_id} in {entry.store} at {entry.endpoint}, "
            f"but {variable} names {where}: point it at the sink's store."
        )
    if entry.store == "postgres":
        from sinks.postgres.admin import PostgresSinkAdmin

        return PostgresSinkAdmin(value, entry.names.get("bookkeepingSchema", "eos"))
    if entry.store == "redis":
        from sinks.redis.admin import RedisSinkAdmin

        return RedisSinkAdmin(value, entry.names.get("bookkeepingPrefix", "eos"))
    from sinks.kafka.admin import KafkaSinkAdmin

    return KafkaSinkAdmin(kafka_client_config(), entry.names.get("transactionalIdPrefix", "eos"),
                          entry.names.get("markerLogTopic", "eos-sink-markers"))  # fmt: skip


_STORE_VARIABLES = {
    "postgres": "EOS_POSTGRES_DSN",
    "redis": "EOS_REDIS_URL",
    "kafka": "EOS_KAFKA_BOOTSTRAP",
}


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

        found.append(KafkaSinkAdmin(kafka_client_config(), args.transactional_id_prefix,
                                    args.marker_log_topic))  # fmt: skip
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
    guard = reset_guard(args) if args.action == "reset" else None
    with admins(args) as stores:
        if args.action == "list":
            return _list(stores)
        owning = [a for a in stores if args.sink_id in {r.sink_id for r in a.records()}]
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
        print(f"{admin.store} {args.sink_id}: committed {len(settled.committed)} unit(s), "
              f"rolled back {len(settled.rolled_back)}")  # fmt: skip
    elif args.action == "reset":
        if not args.yes and not _confirm(f"Forget sink {args.sink_id} in {admin.store}?"):
            print("nothing changed")
            return
        assert guard is not None
        admin.reset(args.sink_id, guard)
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
