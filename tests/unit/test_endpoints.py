from __future__ import annotations

from dataclasses import replace

import pytest

from eos_connectors.core.errors import ConfigError
from eos_connectors.core.secrets import redact
from eos_connectors.dev.endpoints import Endpoints, KafkaSasl


def test_no_variables_means_no_endpoints() -> None:
    assert Endpoints.from_env({}) is None


def test_partial_variables_name_the_missing_ones() -> None:
    with pytest.raises(ConfigError, match="EOS_REDIS_URL"):
        Endpoints.from_env({"EOS_KAFKA_BOOTSTRAP": "h:1", "EOS_POSTGRES_DSN": "postgresql://x"})


def test_describe_hides_passwords() -> None:
    endpoints = Endpoints("h:9092", "postgresql://u:s3cret@h:5432/db", "redis://:s3cret@h:6379/0")
    text = endpoints.describe()
    assert "s3cret" not in text
    assert "postgresql://u:***@h:5432/db" in text
    assert "s3cret" in endpoints.exports()  # exports are for the user's shell, on purpose
    sasl = KafkaSasl("h:9094", "eos", "s3cret")
    shown = repr(Endpoints("h:9092", endpoints.postgres_dsn, endpoints.redis_url, sasl))
    assert "s3cret" not in shown and "postgresql://u:***@h:5432/db" in shown
    assert "s3cret" not in repr(sasl) and sasl.options()["kafka.sasl.password"] == "s3cret"


@pytest.mark.parametrize(
    ("dsn", "expected"),
    [
        ("host=h password=s3cret dbname=x", "host=h password=*** dbname=x"),
        ("host=h password='a b' user=u", "host=h password=*** user=u"),
        ("redis://h:6379/0", "redis://h:6379/0"),
    ],
)
def test_redact(dsn: str, expected: str) -> None:
    assert redact(dsn) == expected


def test_the_sasl_ssl_listener_travels_through_the_environment_and_hides_its_passwords() -> None:
    sasl = KafkaSasl("h:9094", "eos", "s3cret", "h:9095", "/stack/truststore.p12", "tru5t")
    env = {"EOS_KAFKA_BOOTSTRAP": "h:9092", "EOS_POSTGRES_DSN": "x", "EOS_REDIS_URL": "y"}
    again = Endpoints.from_env({**env, **sasl.as_env()})
    assert again is not None and again.kafka_sasl == sasl
    java = sasl.java_options()
    assert java["kafka.security.protocol"] == "SASL_SSL"
    assert 'username="eos" password="s3cret";' in java["kafka.sasl.jaas.config"]
    assert java["kafka.ssl.truststore.password"] == "tru5t"
    assert "s3cret" not in repr(sasl) and "tru5t" not in repr(sasl)
    plain_only = KafkaSasl("h:9094", "eos", "s3cret")
    assert plain_only.java_options() == {} and "EOS_KAFKA_TRUSTSTORE" not in plain_only.as_env()
    assert plain_only.mtls_options() == {} and "EOS_KAFKA_MTLS_BOOTSTRAP" not in sasl.as_env()
    mtls = replace(sasl, mtls_bootstrap="h:9096", client_keystore="/stack/client.p12")
    again = Endpoints.from_env({**env, **mtls.as_env()})
    assert again is not None and again.kafka_sasl == mtls
    assert mtls.mtls_options()["kafka.ssl.keystore.location"] == "/stack/client.p12"
    assert mtls.mtls_options()["kafka.security.protocol"] == "SSL"


def test_the_brokers_proxied_listeners_travel_through_the_environment() -> None:
    proxied = (("127.0.0.1:7001", "127.0.0.1:6001"), ("127.0.0.1:7002", "127.0.0.1:6002"))
    endpoints = Endpoints("h:1", "postgresql://x", "redis://y", kafka_proxied=proxied)
    env = endpoints.as_env()
    assert env["EOS_KAFKA_PROXIED"] == "127.0.0.1:7001=127.0.0.1:6001,127.0.0.1:7002=127.0.0.1:6002"
    assert Endpoints.from_env(env) == endpoints
    plain = Endpoints("h:1", "postgresql://x", "redis://y")
    assert "EOS_KAFKA_PROXIED" not in plain.as_env() and Endpoints.from_env(plain.as_env()) == plain
