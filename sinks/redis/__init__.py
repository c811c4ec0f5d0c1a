"""The Redis sink ``eos_redis``: exactly once through staged units applied by Lua scripts."""

from sinks.redis.options import RedisSinkOptions, parse_options
from sinks.redis.source import RedisDataSource
from sinks.redis.writer import RedisDirectWriter, RedisStagedWriter

__all__ = [
    "RedisDataSource",
    "RedisDirectWriter",
    "RedisSinkOptions",
    "RedisStagedWriter",
    "parse_options",
]
