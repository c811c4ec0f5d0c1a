"""The Redis sink ``eos_redis``: exactly once through staged units applied by Lua scripts."""

from eos_connectors.sinks.redis.at_least_once import RedisAtLeastOnceWriter
from eos_connectors.sinks.redis.exactly_once import RedisExactlyOnceWriter
from eos_connectors.sinks.redis.format import RedisDataSource
from eos_connectors.sinks.redis.options import RedisSinkOptions, parse_options

__all__ = [
    "RedisAtLeastOnceWriter",
    "RedisDataSource",
    "RedisExactlyOnceWriter",
    "RedisSinkOptions",
    "parse_options",
]
