"""Connections to PostgreSQL, pooled per thread; an unreachable server is a clear error
that never shows the password. Used in tasks and on the driver."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from eos_connectors.core.errors import ServiceUnavailableError, keeping_code
from eos_connectors.core.secrets import redact, secret_values, settings_digest
from eos_connectors.sinks.postgres.options import PostgresSinkOptions

Connection = psycopg.Connection[tuple[Any, ...]]

#: The longest a bookkeeping call (an owner check, a decision, ``COMMIT PREPARED``) or a
#: connection attempt waits for PostgreSQL's answer; the statements that write a task's
#: rows wait up to the sink's ``statementTimeoutMs``.
CALL_SECONDS = 15.0


class BoundedConnection(psycopg.Connection[tuple[Any, ...]]):
    """A connection on which every wait for the server has a deadline, kept on the client.

    A server that stops answering without closing (a frozen process, a proxy that holds
    bytes) is acknowledged by its kernel, so neither TCP keepalives, nor a user timeout,
    nor its own ``statement_timeout`` ever end the wait. psycopg waits for every
    statement, COPY block and commit in :meth:`wait`: past the deadline the connection
    is closed (the server rolls its open transaction back; a prepared one stays for the
    protocol) and the call fails with an OperationalError saying so."""

    #: Seconds each wait may last: ``base_seconds``, or longer inside :func:`allowing`.
    base_seconds: float = CALL_SECONDS
    call_seconds: float = CALL_SECONDS
    #: What sets ``call_seconds`` now, for the error: empty, or the option's name.
    bound_by: str = ""
    #: The server process of this session, once asked (:func:`server_pid`).
    server_pid: int | None = None

    def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
        limit = self.call_seconds if timeout is None else timeout
        try:
            return super().wait(gen, interval, limit)
        except psycopg.OperationalError as exc:
            if not isinstance(exc, _WAIT_TIMEOUT):
                raise
            self.close()
            raise psycopg.OperationalError(
                f"PostgreSQL gave no answer within {limit:g} s{self.bound_by}, so the "
                "connection was closed (a stopped or overloaded server, or a network that "
                "holds packets)"
            ) from None


class _NeverRaisedError(Exception):
    pass


#: psycopg's exception for a wait past its timeout (``psycopg.errors._WaitTimeout``, raised
#: by ``Connection.wait(timeout=...)`` in psycopg 3.3, the floor of the dependency range).
_WAIT_TIMEOUT: type[BaseException] = getattr(psycopg.errors, "_WaitTimeout", _NeverRaisedError)


#: How much longer than the server's ``statement_timeout`` the client waits for a statement
#: that writes a task's rows: a live server's own cancel, which names the cause, comes first.
SERVER_FIRST_S = 2.0


@contextlib.contextmanager
def allowing(conn: Connection, seconds: float) -> Iterator[None]:
    """Task: the calls inside (the statements that write a task's rows, whose server-side
    bound is ``statementTimeoutMs`` = ``seconds``) may each wait up to ``seconds`` and
    :data:`SERVER_FIRST_S`; bookkeeping calls keep the connection's ``base_seconds``."""
    if not isinstance(conn, BoundedConnection):
        yield
        return
    conn.call_seconds = seconds + SERVER_FIRST_S
    conn.bound_by = f" (statementTimeoutMs and {SERVER_FIRST_S:g} s)"
    try:
        yield
    finally:
        conn.call_seconds, conn.bound_by = conn.base_seconds, ""


#: libpq's TCP settings for a network that drops packets (a dead peer is found in about
#: a minute instead of the kernel's two hours); a DSN that sets one keeps its own.
TCP_SETTINGS = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
    "tcp_user_timeout": "60000",
}


def connect(options: PostgresSinkOptions, autocommit: bool = True) -> Connection:
    """A connection, or a ServiceUnavailableError that never shows the password."""
    seconds = call_seconds(options)
    given = conninfo_to_dict(options.dsn)
    tcp = {k: v for k, v in TCP_SETTINGS.items() if k not in given}
    try:
        conn = BoundedConnection.connect(
            make_conninfo(options.dsn, **tcp),
            autocommit=autocommit,
            connect_timeout=max(1, int(seconds)),
        )
    except psycopg.Error as exc:
        raise keeping_code(
            ServiceUnavailableError(
                f"PostgreSQL at {redact(options.dsn)} (option 'dsn') is unreachable: "
                f"{first_line(exc, options)}"
            ),
            exc,
        ) from None
    conn.base_seconds = conn.call_seconds = seconds
    _durable_commits(conn)
    return conn


def _durable_commits(conn: Connection) -> None:
    """A commit the sink reports must outlive a server crash: Spark's checkpoint then
    counts the batch as written. A session whose ``synchronous_commit`` is off (the
    server's, the database's or the role's setting) acknowledges a commit before its WAL
    is flushed, so a crash could lose a decided batch; the sink's sessions turn it on.
    A stronger setting (``remote_write``, ``remote_apply``: a synchronous standby) is
    kept."""
    if conn.execute("SHOW synchronous_commit").fetchone() == ("off",):
        conn.execute("SET synchronous_commit = on")
    if not conn.autocommit:
        conn.commit()


def server_pid(conn: Connection) -> int:
    """The server process of ``conn``'s session, asked once per connection: the pid the
    connection was given at start is a pooler's own behind PgBouncer."""
    known = getattr(conn, "server_pid", None)
    if known is None:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        known = int(row[0]) if row else conn.info.backend_pid
        if isinstance(conn, BoundedConnection):
            conn.server_pid = known
    return int(known)


def call_seconds(options: PostgresSinkOptions) -> float:
    """How long a bookkeeping call, or a connection attempt, waits: :data:`CALL_SECONDS`,
    or ``statementTimeoutMs`` when that is shorter."""
    return min(CALL_SECONDS, options.statement_seconds)


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
        pooled = held[1]
        if isinstance(pooled, BoundedConnection):  # this sink's bound, not the last one's
            pooled.base_seconds = pooled.call_seconds = call_seconds(options)
        conn = _answering(pooled)
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
