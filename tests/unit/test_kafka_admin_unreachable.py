"""``eos sinks`` with Kafka unreachable (a closed port on loopback): one clear error within
the reach timeout, naming the address and the variable, and no librdkafka line on the
terminal (it printed ~600 over 60 s before). Cost: ~2 s."""

from __future__ import annotations

import time

import pytest

from eos_connectors.cli import main
from eos_connectors.sinks.kafka import admin


def test_an_unreachable_kafka_is_said_once_and_quickly(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    for name in ("EOS_POSTGRES_DSN", "EOS_REDIS_URL", "EOS_KAFKA_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EOS_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setattr(admin, "REACH_TIMEOUT", 1.5)
    began = time.monotonic()
    assert main(["sinks", "list"]) != 0
    assert time.monotonic() - began < 10
    err = capfd.readouterr().err
    assert "Kafka at 127.0.0.1:1 did not answer within 2 s" in err
    assert "EOS_KAFKA_BOOTSTRAP" in err
    assert "%3|" not in err and "rdkafka" not in err, err[:500]
