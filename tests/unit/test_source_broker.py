"""The source's driver-side offset look-ups when librdkafka answers without an offset.

A CI run on a 3-broker cluster got -1001 (no offset) and no error for a partition
whose leader had just been killed; the source must ask again, never plan with it. The
admin client here is a stand-in for librdkafka's answers, which a live broker gives
only at a moment no test can choose (tests/system/test_kafka_cluster.py kills the
broker for real)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from eos_connectors.core.errors import ServiceUnavailableError
from eos_connectors.core.kafka_errors import ClientErrors
from eos_connectors.sources.kafka import broker
from eos_connectors.sources.kafka.options import parse_options


class _Answer:
    def __init__(self, offset: int) -> None:
        self.offset = offset


class _Admin:
    """Answers each list_offsets call with the next of ``answers`` (offset by
    partition); counts the clients made."""

    made = 0

    def __init__(self, answers: list[dict[int, int]]) -> None:
        self.answers = answers

    def __call__(self, _config: Any) -> _Admin:
        _Admin.made += 1
        return self

    def list_offsets(self, request: dict[TopicPartition, Any], **_kw: Any) -> dict[Any, Any]:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        futures = {}
        for tp in request:
            future: Future[_Answer] = Future()
            future.set_result(_Answer(answer[tp.partition]))
            futures[tp] = future
        return futures

    def poll(self, _timeout: float) -> int:
        return 0


def _view(monkeypatch: pytest.MonkeyPatch, answers: list[dict[int, int]]) -> Any:
    monkeypatch.setattr(broker, "AdminClient", _Admin(answers))
    monkeypatch.setattr("eos_connectors.sources.kafka.broker.time.sleep", lambda _s: None)
    options = parse_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",
            "subscribe": "t",
            "kafkaConsumer.pollTimeoutMs": "2000",
        }
    )
    return broker.BrokerView(options)


def test_a_partition_answered_without_an_offset_is_asked_again_with_a_new_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = _view(monkeypatch, [{0: -1001, 1: 40}, {0: 12, 1: 40}])
    before = _Admin.made
    assert view.latest([("t", 0), ("t", 1)]) == {("t", 0): 12, ("t", 1): 40}
    assert _Admin.made - before == 2  # fresh metadata for the second look-up


def test_no_offset_for_good_fails_clearly_and_a_timestamp_without_records_is_an_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view = _view(monkeypatch, [{0: -1001, 1: 40}])
    with pytest.raises(ServiceUnavailableError, match="no offset for t-0"):
        view.earliest([("t", 0), ("t", 1)])
    # Kafka's -1 for a timestamp past every record is an answer, not a missing one
    view = _view(monkeypatch, [{0: -1, 1: 40}])
    assert view.for_times({("t", 0): 5, ("t", 1): 5}) == {("t", 0): -1, ("t", 1): 40}


@pytest.mark.parametrize("lost", [KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN])
def test_a_timeout_after_losing_one_broker_or_all_of_them_may_be_asked_again(lost: int) -> None:
    """Whether to probe the cluster and ask again: a request timed out after the client
    lost a connection, one broker's or (a network cut) every broker's."""
    errors = ClientErrors()
    timed_out = KafkaException(KafkaError(KafkaError._TIMED_OUT))
    assert not errors.timed_out_on_lost_broker(timed_out)
    errors(KafkaError(lost))
    assert errors.timed_out_on_lost_broker(timed_out)
    errors(KafkaError(KafkaError._AUTHENTICATION))  # refused: never a broker that went
    assert not errors.timed_out_on_lost_broker(timed_out)
