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


class ClientErrors:
    """librdkafka's ``error_cb``: remembers the last error it reported."""

    def __init__(self) -> None:
        self.last: str | None = None
        self._secrets: list[str] = []

    def __call__(self, error: KafkaError) -> None:
        self.last = error.str()

    def watching(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` with this as the client's error callback (its secrets kept to redact)."""
        self._secrets = secret_values(config)
        return {**config, "error_cb": self}

    def reason(self, client: Any, exc: BaseException) -> str:
        """Why ``exc`` happened, with the last client error; no secret of the client's config."""
        client.poll(0)  # serves the error callbacks queued during the call
        reason = exc.args[0].str() if isinstance(exc, KafkaException) and exc.args else str(exc)
        if self.last:
            reason = f"{reason} (the client's last error: {self.last})"
        return redact(reason, self._secrets)
