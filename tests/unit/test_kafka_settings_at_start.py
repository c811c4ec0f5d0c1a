"""Every ``kafka.*`` setting is checked on the driver at start, as the tasks' clients take
it: a Java-only name says what to use instead, a setting librdkafka refuses (or one that
contradicts the idempotent producer) names the option, and no credential is shown. They
failed as raw librdkafka errors inside every task before. A client is built and dropped
(towards a closed loopback port: nothing needs to answer). Cost: well under a second."""

from __future__ import annotations

import pytest

from eos_connectors.core.errors import ConfigError
from eos_connectors.sinks.kafka.checks import check_producer_settings
from eos_connectors.sinks.kafka.options import parse_options
from eos_connectors.sources.kafka.format import KafkaSourceFormat

SINK = {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t", "sinkId": "s"}
SOURCE = {"kafka.bootstrap.servers": "127.0.0.1:1", "subscribe": "t"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"kafka.buffer.memory": "33554432"}, r"'kafka\.buffer\.memory' is a Java client setting"),
        ({"kafka.interceptor.classes": "a.B"}, "runs no Java interceptors"),
        ({"kafka.acks": "1"}, r"refuses option 'kafka\.acks'"),
        ({"kafka.no.such.setting": "1"}, r"option 'kafka\.no\.such\.setting'"),
        ({"kafka.linger.ms": "soon"}, r"option 'kafka\.linger\.ms'"),
    ],
)
def test_the_sinks_producer_settings_are_checked_at_start(
    extra: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        check_producer_settings(parse_options({**SINK, **extra}))


def test_good_settings_pass_and_no_credential_is_shown() -> None:
    check_producer_settings(parse_options({**SINK, "kafka.linger.ms": "20"}))
    secret = {
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.username": "u",
        "kafka.sasl.password": "hunter2-secret",
    }
    with pytest.raises(ConfigError) as refused:
        check_producer_settings(parse_options({**SINK, **secret, "kafka.no.such": "x"}))
    assert "hunter2-secret" not in str(refused.value)


def test_the_sources_consumer_settings_are_checked_at_start() -> None:
    with pytest.raises(ConfigError, match=r"option 'kafka\.fetch\.wait\.max\.ms'"):
        KafkaSourceFormat({**SOURCE, "kafka.fetch.wait.max.ms": "forever"})._check_settings()
    with pytest.raises(ConfigError, match=r"interceptor\.classes"):
        KafkaSourceFormat({**SOURCE, "kafka.interceptor.classes": "a.B"})._check_settings()
    KafkaSourceFormat(SOURCE)._check_settings()
