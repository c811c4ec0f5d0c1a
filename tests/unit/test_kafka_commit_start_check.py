"""The batch commit's start check on a broker that has just started: its transaction
coordinator answers "not available" while it loads the transaction log, which is not
a missing permission. Found on a fresh stack: the first query's start failed, telling
the user to grant DESCRIBE and WRITE. The check now asks again until its timeout.
Cost: under 0.5 s (no server: the client's answers are scripted; the services and
system tiers run the check against real brokers at every batch-commit start)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import kafka.errors as errors
import pytest

from eos_connectors.sinks.kafka import coordinator
from eos_connectors.sinks.kafka.coordinator import TransactionEndError, check_batch_commit


class _Scripted:
    """Stands in for TransactionClient: ``describe`` answers from a script."""

    answers: Iterator[Exception | None]
    asked = 0

    def __init__(self, config: Any, timeout_s: float = 30.0) -> None:
        self.where = "127.0.0.1:9092"

    def describe(self, ids: list[str]) -> dict[str, Any]:
        type(self).asked += 1
        answer = next(type(self).answers)
        if answer is not None:
            raise answer
        return {}

    def sees_offsets_topic(self) -> bool:
        return True  # the real answer: tests/services/test_kafka_acls.py

    def close(self) -> None:
        pass


def _script(monkeypatch: pytest.MonkeyPatch, *answers: Exception | None) -> type[_Scripted]:
    scripted = type("Scripted", (_Scripted,), {"answers": iter(answers), "asked": 0})
    monkeypatch.setattr(coordinator, "TransactionClient", scripted)
    return scripted


def test_a_coordinator_that_is_loading_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    loading = (errors.CoordinatorNotAvailableError(), errors.CoordinatorLoadInProgressError())
    scripted = _script(monkeypatch, *loading, None)
    check_batch_commit({"bootstrap.servers": "127.0.0.1:9092"}, "eos-s-0", timeout_s=5)
    assert scripted.asked == 3


def test_a_coordinator_still_loading_at_the_timeout_fails_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _script(monkeypatch, *[errors.CoordinatorNotAvailableError()] * 100)
    with pytest.raises(
        TransactionEndError, match=r"no transaction coordinator .*answers.*Coordinator"
    ):
        check_batch_commit({"bootstrap.servers": "127.0.0.1:9092"}, "eos-s-0", timeout_s=0.3)


def test_a_refusal_fails_at_once_and_a_new_id_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    scripted = _script(monkeypatch, errors.TransactionalIdAuthorizationFailedError())
    with pytest.raises(TransactionEndError, match="grant them or use commitMode=task"):
        check_batch_commit({"bootstrap.servers": "127.0.0.1:9092"}, "eos-s-0", timeout_s=5)
    assert scripted.asked == 1
    _script(monkeypatch, errors.TransactionalIdNotFoundError())
    check_batch_commit({"bootstrap.servers": "127.0.0.1:9092"}, "eos-s-0", timeout_s=5)


def test_a_coordinator_whose_broker_died_is_asked_again_as_long_as_a_commit_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A broker's death (the cluster run: the check runs again in each new driver-side
    process of a running query): the check waits for the coordinator to move as long as
    the commits do, not 15 s, which failed the query there."""
    import inspect

    scripted = _script(monkeypatch, errors.KafkaConnectionError(), errors.NodeNotReadyError(), None)
    check_batch_commit({"bootstrap.servers": "127.0.0.1:9092"}, "eos-s-0", timeout_s=5)
    assert scripted.asked == 3
    waits = inspect.signature(check_batch_commit).parameters["timeout_s"].default
    assert waits == coordinator.COORDINATOR_WAIT_S >= 30
