"""Clients of Redis, one per worker and URL, checked when taken; an unreachable server is a
clear error that never shows the password. Used in tasks and on the driver."""

from __future__ import annotations

import socket

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from eos_connectors.core.errors import ServiceUnavailableError, keeping_code
from eos_connectors.core.secrets import redact, secret_values, settings_digest
from eos_connectors.sinks.redis.options import RedisSinkOptions

#: The longest a connection attempt waits (or ``socketTimeoutMs``, when shorter). One
#: command waits ``socketTimeoutMs``: a server that stops answering without closing (a
#: frozen process, a proxy that holds bytes) is acknowledged by its kernel, so only a
#: client-side timeout ends the wait; the call then fails, and the protocol's patience
#: (or Spark's task retry) decides what happens next.
CONNECT_TIMEOUT = 10.0
#: TCP keepalive settings this platform has (macOS names the idle time TCP_KEEPALIVE).
KEEPALIVE = {
    getattr(socket, name): value
    for name, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3))
    if hasattr(socket, name)
}


def connect(options: RedisSinkOptions) -> redis.Redis:
    """A client that has answered PING, or a ServiceUnavailableError without the password.

    The client never sends a command again by itself (redis-py retries a timed-out call
    3 to 10 times, depending on its version): a late first copy of a stage or an apply
    could then interleave with the retry. The protocol retries instead, knowing what
    is safe to send twice."""
    client = redis.Redis.from_url(
        options.url,
        socket_connect_timeout=min(CONNECT_TIMEOUT, options.socket_timeout_ms / 1000),
        socket_timeout=options.socket_timeout_ms / 1000,
        socket_keepalive=True,  # a network that drops packets: a dead peer found in ~1 min
        socket_keepalive_options=KEEPALIVE,
        retry=Retry(NoBackoff(), 0),
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
    key = f"{settings_digest(options.url)}|{options.socket_timeout_ms}"
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
