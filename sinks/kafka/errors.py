"""What to do about a transactional producer error, decided by librdkafka's flags.

Never by message text: ``KafkaError`` carries ``fatal()``, ``txn_requires_abort()``
and ``retriable()``, set by librdkafka for exactly this decision.
"""

from __future__ import annotations

from enum import Enum

from confluent_kafka import KafkaError, KafkaException

from eos_connectors.core.errors import EosError
from eos_connectors.core.kafka_errors import CONNECTION_LOST

FENCED_CODES = frozenset({KafkaError._FENCED, KafkaError.PRODUCER_FENCED})
#: A group or transaction coordinator moving to another broker (one of a replicated
#: cluster died, or the offsets topic's leaders are still being chosen): asked again,
#: though a consumer's result does not always mark them retriable.
COORDINATOR_MOVING = frozenset(
    {
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)
#: Asked again besides what librdkafka flags retriable: a coordinator moving, and a
#: connection lost under a request or no broker up (CONNECTION_LOST). librdkafka flags
#: its transactional calls' errors itself, but a metadata look-up or a committed-offsets
#: read that met a reset connection comes back unflagged (a task's topic look-up failed
#: so during a 4 s Kafka connection reset, and Spark had to retry the task).
ASKED_AGAIN = COORDINATOR_MOVING | CONNECTION_LOST


class Action(Enum):
    RETRY = "retry the call"
    ABORT = "abort the transaction and fail the attempt (Spark retries the task)"
    FAIL = "fail: fenced, fatal, or not cured by asking again"


def classify(error: KafkaError) -> Action:
    """The one place that decides how a transactional error is handled."""
    if error.fatal() or error.code() in FENCED_CODES:
        return Action.FAIL
    if error.txn_requires_abort():
        return Action.ABORT
    if error.retriable() or error.code() in ASKED_AGAIN:
        return Action.RETRY
    return Action.FAIL


def error_of(exc: KafkaException) -> KafkaError:
    error = exc.args[0] if exc.args else None
    if isinstance(error, KafkaError):
        return error
    return KafkaError(KafkaError._FAIL, str(exc))


class KafkaSinkError(EosError):
    """The Kafka sink could not complete a task's transaction."""


def acl_needed(error: KafkaError, marker_topic: str, names: str) -> str:
    """What the sink's principal lacks when ``error`` is an ACL refusal ("" otherwise):
    ``marker_topic`` holds the markers, ``names`` is ``<prefix>-<sink id>-*``."""
    needs = {
        KafkaError.TOPIC_AUTHORIZATION_FAILED: (
            f"READ (besides WRITE) on topic {marker_topic!r}: the sink keeps its markers as "
            "consumer-group offsets on its partition 0"
        ),
        KafkaError.GROUP_AUTHORIZATION_FAILED: f"READ on the consumer groups {names!r}",
        KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED: (
            f"WRITE and DESCRIBE on the transactional ids {names!r}"
        ),
    }.get(error.code())
    if needs is None:
        return ""
    return f" The sink's principal needs {needs} (docs/deploy.md lists every ACL)."
