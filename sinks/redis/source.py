"""``eos_redis``: the data source Spark instantiates by format name."""

from __future__ import annotations

import logging
import warnings

import redis
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter
from pyspark.sql.types import StructType

from connectors.errors import ConfigError
from sinks.redis import values
from sinks.redis.options import RedisSinkOptions, parse_options
from sinks.redis.writer import RedisDirectWriter, RedisStagedWriter, connect

log = logging.getLogger(__name__)


class RedisDataSource(DataSource):
    """Streaming sink into Redis keys, exactly once through staged, atomically applied units.

    See :class:`sinks.redis.writer.RedisStagedWriter` for the guarantee.
    """

    @classmethod
    def name(cls) -> str:
        return "eos_redis"

    @property
    def config(self) -> RedisSinkOptions:
        return parse_options(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = self.config
        spec = values.layout(options, schema)
        if overwrite and options.mode == "increment":
            raise ConfigError(
                "outputMode 'complete' sends the whole result every batch: in mode=increment "
                "every counter would grow by its total each batch. Use mode=upsert, or emit "
                "per-batch changes in outputMode 'append'."
            )
        client = connect(options)
        try:
            check_server(client)
        finally:
            client.close()
        if options.exactly_once:
            return RedisStagedWriter(options, spec)
        return RedisDirectWriter(options, spec)


def check_server(client: redis.Redis) -> None:
    """Refuse Redis Cluster; warn when the server would lose acknowledged writes on restart."""
    info = client.info("cluster")
    if int(info.get("cluster_enabled", 0)):
        raise ConfigError(
            "eos_redis does not support Redis Cluster: a unit's Lua script writes keys of "
            "many hash slots. Point option 'url' at a standalone server or a primary with "
            "replicas."
        )
    try:
        appendonly = client.config_get("appendonly").get("appendonly")
    except redis.ResponseError:  # CONFIG is often disabled on managed services
        log.info("could not read Redis's appendonly setting (CONFIG is disabled)")
        return
    if appendonly == "no":
        message = (
            "Redis runs with appendonly no: a server restart loses the writes since its last "
            "snapshot, committed batches included. Set appendonly yes (appendfsync everysec "
            "or always) for exactly-once across Redis restarts."
        )
        log.warning(message)
        warnings.warn(message, stacklevel=2)
