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
        ({"kafka.compression.zstd.level": "3"}, r"set kafka\.compression\.level"),
        ({"kafka.ssl.enabled.protocols": "TLSv1.3"}, "TLS versions its OpenSSL allows"),
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
    with pytest.raises(ConfigError, match=r"default\.api\.timeout\.ms' is a Java client"):
        KafkaSourceFormat({**SOURCE, "kafka.default.api.timeout.ms": "1"})._check_settings()
    KafkaSourceFormat(SOURCE)._check_settings()


def test_kerberos_on_a_librdkafka_without_gssapi_says_how_to_get_it() -> None:
    """The confluent-kafka wheels on PyPI are built without Cyrus SASL: a Kerberos job
    fails at start naming the mechanism and what it needs, not in every task."""
    kerberos = {
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "GSSAPI",
        "kafka.sasl.kerberos.kinit.cmd": "true",
    }
    try:
        check_producer_settings(parse_options({**SINK, **kerberos}))
    except ConfigError as refused:
        assert "built from source against a librdkafka with Cyrus SASL" in str(refused)
    else:
        pytest.skip("this librdkafka was built with GSSAPI")
    with pytest.raises(ConfigError, match="built from source"):
        KafkaSourceFormat({**SOURCE, **kerberos})._check_settings()


def test_javas_names_for_common_settings_are_librdkafkas_under_theirs() -> None:
    """A Spark job's ``kafka.max.request.size`` (and the socket buffers, the fetch wait)
    is librdkafka's setting of the same meaning under another name; librdkafka refused
    the Java names at start before ("No such configuration property")."""
    java = {
        "kafka.max.request.size": "5242880",
        "kafka.receive.buffer.bytes": "-1",
        "kafka.send.buffer.bytes": "131072",
    }
    options = parse_options({**SINK, **java})
    check_producer_settings(options)
    assert options.kafka["message.max.bytes"] == "5242880"
    assert options.kafka["socket.receive.buffer.bytes"] == "0"  # Java's -1: the system's
    assert options.kafka["socket.send.buffer.bytes"] == "131072"
    assert "max.request.size" not in options.kafka
    source = KafkaSourceFormat({**SOURCE, "kafka.fetch.max.wait.ms": "250"})
    source._check_settings()
    with pytest.raises(ConfigError, match=r"Java's 'kafka\.fetch\.max\.wait\.ms'"):
        KafkaSourceFormat({**SOURCE, "kafka.fetch.max.wait.ms": "soon"})._check_settings()
    twice = {"kafka.max.request.size": "2000000", "kafka.message.max.bytes": "3000000"}
    with pytest.raises(ConfigError, match=r"'kafka\.max\.request\.size' .* one setting"):
        parse_options({**SINK, **twice})
