"""What librdkafka says when a broker call fails, secrets redacted.

A failed sign-in (a wrong SASL password, an SSL handshake) reaches the error
callback only; the call itself just reports "broker transport failure". A
client made with ``error_cb=ClientErrors()`` keeps the last one for the message.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from eos_connectors.core.secrets import redact, secret_values

#: For a client a worker keeps between tasks: the broker closes idle connections
#: (connections.max.idle.ms) and librdkafka reconnects when needed, but by default it
#: logs each such close as an error line.
QUIET_IDLE_CLOSE = {"log.connection.close": False}

#: A partition whose leader is being chosen or moved: a partition just added (the
#: brokers list it some tens of ms before its leader answers), a broker of a replicated
#: cluster killed or restarting (its partitions' leadership moves to another replica,
#: with a new leader epoch). librdkafka does not mark these retriable in every result,
#: so the callers ask again, backing off, within their time bound.
LEADER_MOVING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError.FENCED_LEADER_EPOCH,
        KafkaError.UNKNOWN_LEADER_EPOCH,
        KafkaError.OFFSET_NOT_AVAILABLE,
    }
)


#: The connection to a broker broke or its handle went (a broker of a replicated cluster
#: died, and the client dropped it, or its metadata lost the partition while the leader
#: moved): a task asks again within its time bound. Not in
#: LEADER_MOVING, because a failed sign-in reads as a transport failure too.
BROKER_GONE = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._DESTROY_BROKER,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._UNKNOWN_PARTITION,  # the client's metadata lost the partition a moment
    }
)


#: The client's last error said it lost a broker, or all of them (a network cut off
#: the whole cluster for a few seconds: its admin requests then waited for a controller
#: until they timed out, though every broker answered again; seen in make soak).
CONNECTION_LOST = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})

#: The brokers refused the client: never a broker that went away.
REFUSED = frozenset(
    {
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
        KafkaError.SASL_AUTHENTICATION_FAILED,
        KafkaError.ILLEGAL_SASL_STATE,
        KafkaError.UNSUPPORTED_SASL_MECHANISM,
    }
)


def error_code(exc: BaseException) -> int | None:
    """librdkafka's error code in ``exc``, None when it is not a client error."""
    return exc.args[0].code() if isinstance(exc, KafkaException) and exc.args else None


def leader_moving(exc: BaseException) -> bool:
    """Whether ``exc`` says a partition's leader is moving (ask again soon)."""
    return error_code(exc) in LEADER_MOVING


def no_leader_known(exc: BaseException) -> bool:
    """Whether ``exc`` is librdkafka's ListOffsets failing before it asked anyone:
    ``_NOENT``, "Failed to query partition leaders: No leaders found", when the client's
    metadata names no reachable leader for a partition (its only broker cut off for a
    few seconds, or a leader moving). A client made after that asks again from fresh
    metadata; the same client fails at once every time (a query's source failed so,
    "in 0 s", during a 4 s Kafka cut)."""
    return error_code(exc) == KafkaError._NOENT


class ClientErrors:
    """librdkafka's ``error_cb``: remembers the last error it reported."""

    def __init__(self) -> None:
        self.last: str | None = None
        self.last_code: int | None = None
        self.refused = False  # the brokers refused the client's credentials or TLS
        self._secrets: list[str] = []

    def __call__(self, error: KafkaError) -> None:
        self.last = error.str()
        self.last_code = error.code()
        self.refused = self.refused or error.code() in REFUSED

    def broker_gone(self, exc: BaseException) -> bool:
        """Whether ``exc`` says a broker went away (ask another), and not that the
        brokers refused this client (a failed sign-in also reads as a transport
        failure; its reason reaches the error callback only)."""
        return error_code(exc) in BROKER_GONE and not self.refused

    def timed_out_on_lost_broker(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a request that timed out while the client's last error was a
        lost connection: a broker it waited for (the controller an admin request goes to,
        a partition's leader) may have died since its metadata named it, or none answers
        at all; the caller tells which."""
        timed_out = isinstance(exc, TimeoutError) or error_code(exc) == KafkaError._TIMED_OUT
        return timed_out and self.last_code in CONNECTION_LOST and not self.refused

    def watching(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` with this as the client's error callback (its secrets kept to redact)."""
        self._secrets = secret_values(config)
        return {**config, "error_cb": self}

    def reason(self, client: Any, exc: BaseException) -> str:
        """Why ``exc`` happened, with the last client error; no secret of the client's config."""
        client.poll(0)  # serves the error callbacks queued during the call
        reason = exc.args[0].str() if isinstance(exc, KafkaException) and exc.args else str(exc)
        reason = reason or f"no answer in time ({type(exc).__name__})"
        if self.last:
            reason = f"{reason} (the client's last error: {self.last})"
        return redact(reason, self._secrets)
