"""``eos_redis``: the data source Spark instantiates by format name."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping

import redis
from pyspark.sql.types import StructType

from eos_connectors.core import batch_job
from eos_connectors.core.checkpoint_sinks import (
    SinkEntry,
    checkpoint_location,
    record_at_start,
    redis_endpoint,
)
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.sink_switch import (
    StartingSink,
    at_least_once_sink,
    check_moved_bookkeeping,
    settle_before_at_least_once,
    starting_sink,
)
from eos_connectors.core.sinks_admin import ORPHAN_AGE_SECONDS, SinkRecord
from eos_connectors.core.sinks_admin import warn_about_orphans as shared_warning
from eos_connectors.core.startup import once_per_driver, start_key
from eos_connectors.sinks.redis import access
from eos_connectors.sinks.redis.at_least_once import RedisAtLeastOnceWriter
from eos_connectors.sinks.redis.connection import connect
from eos_connectors.sinks.redis.exactly_once import RedisExactlyOnceWriter
from eos_connectors.sinks.redis.layout import layout
from eos_connectors.sinks.redis.options import RedisSinkOptions, parse_options

log = logging.getLogger(__name__)

NAME = "eos_redis"


class RedisDataSource(batch_job.SinkFormat):
    """Streaming sink into Redis keys, exactly once through staged, atomically applied units.

    See :class:`eos_connectors.sinks.redis.exactly_once.RedisExactlyOnceWriter` for the guarantee.
    """

    @classmethod
    def name(cls) -> str:
        return "eos_redis"

    @property
    def sink_config(self) -> RedisSinkOptions:
        return parse_options(self.options)

    connector = NAME
    instead_of_overwrite = "delete the keys first, then append"

    def _writer(
        self, schema: StructType, overwrite: bool
    ) -> RedisExactlyOnceWriter | RedisAtLeastOnceWriter:
        options = self.sink_config
        spec = layout(options, schema)
        if overwrite and options.mode == "increment":
            raise ConfigError(
                "outputMode 'complete' sends the whole result every batch: in mode=increment "
                "every counter would grow by its total each batch. Use mode=upsert, or emit "
                "per-batch changes in outputMode 'append'."
            )
        once_per_driver(
            start_key("eos_redis", self.options, schema),
            lambda: start_checks(options, self.options),
        )
        if options.exactly_once:
            return RedisExactlyOnceWriter(options, spec, checkpoint_location(self.options))
        return RedisAtLeastOnceWriter(options, spec, checkpoint_location(self.options))


def start_checks(options: RedisSinkOptions, raw: Mapping[str, str] | None = None) -> None:
    """Driver, at a query's start: the server's settings, then orphans; the sink recorded
    in the query's checkpoint (``raw``: Spark's options)."""
    with access.explained(options):
        client = connect(options)
        try:
            check_server(client, options.exactly_once)
            access.check(client, options)
        finally:
            client.close()
    if options.exactly_once:
        starting = starting_sink(raw or {}, options.sink_id_for, NAME)
        warn_about_orphans(options, starting=starting)
        if starting is not None:
            _check_moved_bookkeeping(options, starting)
        record_at_start(raw or {}, lambda query_id: checkpoint_entry(options, query_id))
    else:
        _settle_before_at_least_once(options, raw or {})


def _settle_before_at_least_once(options: RedisSinkOptions, raw: Mapping[str, str]) -> None:
    """Driver, at an at-least-once start: ``settle_before_at_least_once``, unless the
    user may not read the exactly-once bookkeeping (which at least once does not need:
    an exactly-once run of the sink id with it would have been another user's)."""
    from eos_connectors.sinks.redis.admin import RedisSinkAdmin

    sid = at_least_once_sink(raw, options.sink_id, options.sink_id_for)
    try:
        settle_before_at_least_once(
            RedisSinkAdmin(options.url, options.bookkeeping_prefix), sid, NAME
        )
    except redis.exceptions.NoPermissionError as exc:
        log.info("eos_redis: the exactly-once bookkeeping of sink %s is not readable: %s", sid, exc)


def _check_moved_bookkeeping(options: RedisSinkOptions, starting: StartingSink) -> None:
    """Driver, at a stream's start: ``bookkeepingPrefix`` changed since the earlier start while
    the sink's last batch there is incomplete is refused (``check_moved_bookkeeping``)."""
    from eos_connectors.sinks.redis.admin import RedisSinkAdmin

    check_moved_bookkeeping(
        starting,
        "redis",
        "bookkeepingPrefix",
        options.bookkeeping_prefix,
        lambda old: RedisSinkAdmin(options.url, old),
    )


def checkpoint_entry(options: RedisSinkOptions, query_id: str) -> SinkEntry:
    """The sink as its query's checkpoint records it (see ``core.checkpoint_sinks``)."""
    sink_id = options.sink_id_for(query_id)
    names = {"bookkeepingPrefix": options.bookkeeping_prefix}
    endpoint = redis_endpoint(options.url)
    return SinkEntry("redis", sink_id, query_id, options.key_prefix + "*", endpoint, names)


def warn_about_orphans(
    options: RedisSinkOptions,
    older_than: float = ORPHAN_AGE_SECONDS,
    starting: StartingSink | None = None,
) -> list[SinkRecord]:
    """Driver, at query start: staged units of sink ids on this key prefix (or of unknown
    target) idle for ``older_than`` seconds, logged as a warning. First, with ``starting``,
    a stream restarted through another sink id mid-batch is refused
    (``refuse_a_switch_mid_batch``)."""
    from eos_connectors.sinks.redis.admin import RedisSinkAdmin

    admin = RedisSinkAdmin(options.url, options.bookkeeping_prefix)
    return shared_warning(admin, options.key_prefix + "*", "Redis", older_than, starting)


#: Eviction policies that never evict a key without a TTL (the sink's bookkeeping has none).
SAFE_EVICTION = ("noeviction", "volatile-")


def check_server(client: redis.Redis, exactly_once: bool = True) -> None:
    """Refuse Redis Cluster and a replica, and for exactly-once an eviction policy that
    can evict the sink's bookkeeping; warn when the server would lose acknowledged writes
    on restart."""
    info = client.info("cluster")
    if int(info.get("cluster_enabled", 0)):
        raise ConfigError(
            "eos_redis does not support Redis Cluster: a unit's Lua script writes keys of "
            "many hash slots. Point option 'url' at a standalone server or a primary with "
            "replicas."
        )
    _refuse_replica(client)
    try:
        config = client.config_get("appendonly")
        config.update(client.config_get("appendfsync"))
        config.update(client.config_get("maxmemory-policy"))
    except redis.ResponseError:  # CONFIG is often disabled on managed services
        log.warning(
            "could not read Redis's appendonly and maxmemory-policy settings (CONFIG is "
            "disabled): make sure maxmemory-policy is noeviction or volatile-*, or an evicted "
            "stage or decision loses or duplicates a batch"
        )
        return
    policy = str(config.get("maxmemory-policy", "noeviction"))
    if exactly_once and not policy.startswith(SAFE_EVICTION):
        raise ConfigError(
            f"Redis runs with maxmemory-policy {policy}: under memory pressure it can evict the "
            "sink's staged units (a batch lost) or decisions (a batch written twice). Set "
            "maxmemory-policy noeviction (or a volatile-* policy, which evicts only keys with "
            "a TTL: the sink's bookkeeping has none), or use deliveryGuarantee=at-least-once."
        )
    message = _durability_warning(config.get("appendonly"), config.get("appendfsync"))
    if message:
        log.warning(message)
        warnings.warn(message, stacklevel=2)


def _durability_warning(appendonly: object, appendfsync: object) -> str | None:
    """What a restart or a machine's crash can lose of the writes Redis acknowledged."""
    if appendonly == "no":
        return (
            "Redis runs with appendonly no: a server restart loses the writes since its last "
            "snapshot, committed batches included. Set appendonly yes (appendfsync everysec "
            "or always) for exactly-once across Redis restarts."
        )
    if appendfsync == "no":
        return (
            "Redis runs with appendfsync no: the operating system flushes its log when it "
            "likes (about every 30 s on Linux), so a machine's crash can lose that much of "
            "what Redis acknowledged, committed batches included. Set appendfsync everysec "
            "or always."
        )
    return None


def _refuse_replica(client: redis.Redis) -> None:
    """A replica refuses writes (``READONLY``), or, with ``replica-read-only no``, takes
    them and drops them at its next sync with its primary, which never had them: either
    way, at start and in both guarantees, the sink refuses it."""
    replication = client.info("replication")
    if replication.get("role") == "slave":
        where = f"{replication.get('master_host')}:{replication.get('master_port')}"
        raise ConfigError(
            f"Option 'url' points at a Redis replica (of the primary at {where}): a replica "
            "refuses writes, or with replica-read-only no keeps them only until it next syncs "
            "with its primary, which never sees them. Point 'url' at the primary."
        )
