"""Connections to PostgreSQL, pooled per thread; an unreachable server is a clear error
that never shows the password. Used in tasks and on the driver."""

from __future__ import annotations

import os
import threading
from typing import Any

import psycopg

from eos_connectors.core.errors import ServiceUnavailableError, keeping_code
from eos_connectors.core.secrets import redact, secret_values, settings_digest
from eos_connectors.sinks.postgres.options import PostgresSinkOptions

Connection = psycopg.Connection[tuple[Any, ...]]


def connect(options: PostgresSinkOptions, autocommit: bool = True) -> Connection:
    """A connection, or a ServiceUnavailableError that never shows the password."""
    try:
        return psycopg.connect(options.dsn, autocommit=autocommit, connect_timeout=15)
    except psycopg.Error as exc:
        raise keeping_code(
            ServiceUnavailableError(
                f"PostgreSQL at {redact(options.dsn)} (option 'dsn') is unreachable: "
                f"{first_line(exc, options)}"
            ),
            exc,
        ) from None


class _Pool(threading.local):
    """This thread's idle autocommit connections, by a digest of the DSN (which may hold
    a password), each with the id of the process that opened it.

    Spark reuses its Python workers across tasks, so a task's checks and its prepared
    transaction use the connection the worker's previous task gave back instead of two
    new ones, and the driver's commit the one of its previous commit. A writer takes a
    connection for its own use and gives it back when done; only a connection outside
    any transaction goes back."""

    def __init__(self) -> None:
        self.idle: dict[str, tuple[int, Connection]] = {}


_POOL = _Pool()


def take(options: PostgresSinkOptions, purpose: str = "main") -> Connection:
    """Task or driver: this thread's idle connection for ``options.dsn`` and ``purpose``
    (a task's key claims use a second one beside its transaction's) once it answered a
    query, or a new one. One that does not answer (the server restarted, the connection
    dropped) is closed; a new one fails clearly if PostgreSQL is unreachable."""
    held = _POOL.idle.pop(_pool_key(options, purpose), None)
    if held is not None and held[0] == os.getpid():  # not a forked parent's: leave that be
        conn = _answering(held[1])
        if conn is not None:
            return conn
    return connect(options)


def give_back(options: PostgresSinkOptions, conn: Connection, purpose: str = "main") -> None:
    """Task or driver: ``conn`` into this thread's pool when it is outside any transaction,
    else closed (the server then rolls back the open transaction, not prepared ones)."""
    key = _pool_key(options, purpose)
    idle = not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    if idle and key not in _POOL.idle:  # one a DSN and purpose is enough
        _POOL.idle[key] = (os.getpid(), conn)
    else:
        conn.close()


def _pool_key(options: PostgresSinkOptions, purpose: str) -> str:
    return f"{settings_digest(options.dsn)}|{purpose}"


def _answering(conn: Connection) -> Connection | None:
    try:
        conn.execute("SELECT 1")
        return conn
    except psycopg.Error:
        conn.close()
        return None


def first_line(exc: Exception, options: PostgresSinkOptions) -> str:
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    return redact(text.splitlines()[0], secret_values({"dsn": options.dsn}))
