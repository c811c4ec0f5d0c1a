"""The package's exception hierarchy: one root, every name ends in ``Error``.

Two rules every raise of this package follows:

1. **Chain the cause** (``raise ... from exc``), unless its text may carry a
   credential: libpq quotes a connection string around a mistake, redis-py and
   urllib echo URLs, a JAAS parse error quotes the login. Such a cause is dropped
   (``from None``) and its *code* kept on the raised error instead, with
   :func:`keeping_code`: ``code`` is the SQLSTATE of a PostgreSQL error, the name of
   a Kafka error code (``librdkafka``'s ``KafkaError.name()``), the status of an HTTP
   answer; ``retriable`` what the client library said of it, when it says.
2. **Decide on codes and flags, never on message text**: ``err.code``,
   ``err.retriable``, psycopg's SQLSTATE classes, ``KafkaError.code()`` and its
   flags (:mod:`eos_connectors.core.kafka_errors`). A message is for people.
"""

from __future__ import annotations

from typing import Any, TypeVar


class EosError(Exception):
    """Root of every error this package raises on purpose.

    ``code`` and ``retriable`` are those of the cause when it was dropped for the sake of
    a credential (see the module's rules); None when there is no such cause."""

    code: str | None = None
    retriable: bool | None = None


class ConfigError(EosError, ValueError):
    """An option is missing, unknown or malformed; the message names the option."""


class StackError(EosError):
    """The local service stack could not be installed, started, reached or stopped."""


class ServiceUnavailableError(EosError):
    """A Kafka, PostgreSQL or Redis server did not answer within the allowed time."""


class DataLossError(EosError):
    """Records the query needs are gone from the source (for example deleted by retention)."""


class BadRecordError(EosError):
    """A record a sink cannot write as it is (a null key, two changes of one key with no
    order); the message names it and what to do, and nothing of the task is written."""


E = TypeVar("E", bound=EosError)


def keeping_code(error: E, cause: BaseException) -> E:
    """``error``, to be raised ``from None``, with the code of ``cause`` kept on it."""
    error.code, error.retriable = code_of(cause)
    return error


def code_of(cause: BaseException) -> tuple[str | None, bool | None]:
    """(code, retriable) of an exception from one of the client libraries, read from its
    attributes (this module imports none of them): psycopg's ``sqlstate``,
    confluent-kafka's ``KafkaError`` (a ``KafkaException``'s first argument), an HTTP
    error's ``code``; an :class:`EosError`'s own."""
    if isinstance(cause, EosError):
        return cause.code, cause.retriable
    sqlstate = getattr(cause, "sqlstate", None)
    if isinstance(sqlstate, str):
        return sqlstate, None
    kafka: Any = cause.args[0] if cause.args else None
    if kafka is not None and _is_kafka_error(kafka):
        return str(kafka.name()), bool(kafka.retriable())
    status = getattr(cause, "code", None)
    if isinstance(status, int):
        return str(status), None
    return None, None


def _is_kafka_error(value: Any) -> bool:
    return all(callable(getattr(value, name, None)) for name in ("code", "name", "retriable"))
