"""Clients of Redis, one per worker and URL, checked when taken; an unreachable server is a
clear error that never shows the password. Used in tasks and on the driver."""

from __future__ import annotations

import redis

from eos_connectors.core.errors import ServiceUnavailableError, keeping_code
from eos_connectors.core.secrets import redact, secret_values, settings_digest
from eos_connectors.sinks.redis.options import RedisSinkOptions

SOCKET_TIMEOUT = 300.0


def connect(options: RedisSinkOptions) -> redis.Redis:
    """A client that has answered PING, or a ServiceUnavailableError without the password."""
    client = redis.Redis.from_url(
        options.url, socket_connect_timeout=10, socket_timeout=SOCKET_TIMEOUT
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        client.close()
        raise keeping_code(
            ServiceUnavailableError(
                f"Redis at {redact(options.url)} (option 'url') is unreachable: "
                f"{redact(str(exc), secret_values({'url': options.url}))}"
            ),
            exc,
        ) from None
    return client


#: This Python worker's Redis clients, by a digest of the URL (which may hold a
#: password). Spark reuses its workers across tasks, so a task does not connect and
#: PING twice before its first command; each client answers a PING when taken.
_CLIENTS: dict[str, redis.Redis] = {}


def pooled(options: RedisSinkOptions) -> redis.Redis:
    """Task or driver: this worker's client for ``options.url`` after it answered a
    PING; a client that does not (Redis restarted, the connection dropped) is closed
    and replaced by a new one, which fails clearly if Redis is unreachable."""
    key = settings_digest(options.url)
    client = _CLIENTS.pop(key, None)
    if client is not None:
        try:
            client.ping()
        except redis.RedisError:
            client.close()
            client = None
    _CLIENTS[key] = client or connect(options)
    return _CLIENTS[key]


def as_text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
