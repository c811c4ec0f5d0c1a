"""The Redis sink ``eos_redis``: exactly once through staged units applied by Lua scripts."""

from eos_connectors.sinks.redis.options import RedisSinkOptions, parse_options
from eos_connectors.sinks.redis.source import RedisDataSource
from eos_connectors.sinks.redis.writer import RedisAtLeastOnceWriter, RedisExactlyOnceWriter

__all__ = [
    "RedisAtLeastOnceWriter",
    "RedisDataSource",
    "RedisExactlyOnceWriter",
    "RedisSinkOptions",
    "parse_options",
]
