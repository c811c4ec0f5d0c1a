"""librdkafka's own lines go through Python logging (``eos_connectors.librdkafka``), never
straight to the terminal, and a connection it keeps retrying is INFO, not an error: the
call that cannot finish raises and says so. A client towards a closed loopback port:
nothing needs to answer. Cost: ~2 s."""

from __future__ import annotations

import logging

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from eos_connectors.core.kafka_config import logged


def test_a_client_logs_through_python_and_a_retried_connection_is_info(
    capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="eos_connectors.librdkafka"):
        admin = AdminClient(logged({"bootstrap.servers": "127.0.0.1:1"}))
        with pytest.raises(KafkaException):
            admin.list_topics(timeout=1.5)
        admin.poll(0.1)  # delivers the queued log lines
    failures = [r for r in caplog.records if r.args and r.args[0] == "FAIL"]  # type: ignore[index]
    assert failures, "librdkafka's connection failures did not reach Python logging"
    assert {r.levelno for r in failures} == {logging.INFO}
    assert "%3|" not in capfd.readouterr().err
