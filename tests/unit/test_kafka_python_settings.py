"""The driver's transaction client takes the sink's one librdkafka dict (issue 53):
kafka-python's names, and a setting it cannot honour refused naming the fallback mode,
with no password in the message. Cost: under 0.1 s."""

from __future__ import annotations

import pytest

from eos_connectors.core.errors import ConfigError
from eos_connectors.core.kafka_config import to_kafka_python


def test_the_driver_client_takes_the_sinks_librdkafka_settings() -> None:
    settings = {
        "bootstrap.servers": "a:9092, b:9093",
        "security.protocol": "sasl_plaintext",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "u",
        "sasl.password": "p",
    }
    assert to_kafka_python(settings) == {
        "bootstrap_servers": ["a:9092", "b:9093"],
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "u",
        "sasl_plain_password": "p",
    }
    with pytest.raises(ConfigError, match="commitMode=task") as refused:
        to_kafka_python({**settings, "sasl.mechanism": "OAUTHBEARER"})
    assert "'p'" not in str(refused.value)
    with pytest.raises(
        ConfigError, match=r"'kafka\.sasl\.kerberos\.service\.name'.*commitMode=task"
    ):
        to_kafka_python({**settings, "sasl.kerberos.service.name": "kafka"})


def test_tls_settings_become_a_context_that_keeps_the_host_name_choice() -> None:
    import ssl

    settings = {
        "bootstrap.servers": "a:9093",
        "security.protocol": "SSL",
        "ssl.endpoint.identification.algorithm": "none",
    }
    out = to_kafka_python(settings)
    assert out["security_protocol"] == "SSL"
    assert isinstance(out["ssl_context"], ssl.SSLContext)
    assert out["ssl_context"].check_hostname is False
