"""The driver's transaction client takes the sink's one librdkafka dict (issue 53):
kafka-python's names, and a setting it cannot honour refused naming the fallback mode,
with no password in the message. Cost: under 0.2 s."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

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
        to_kafka_python({**settings, "sasl.mechanism": "GSSAPI"})
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


def _client_certificate() -> tuple[Any, Any]:
    """An EC key and a self-signed certificate for it (a client's, for mutual TLS)."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "client")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return key, certificate


def _pem(certificate: Any) -> str:
    from cryptography.hazmat.primitives.serialization import Encoding

    return str(certificate.public_bytes(Encoding.PEM).decode())


def test_a_client_certificate_as_pem_text_or_a_keystore_signs_the_driver_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutual TLS in the default mode: the client's certificate as PEM text (an
    encrypted key with its password) or a PKCS#12 keystore (a Java job's) is loaded into
    the driver's context (kafka-python's client refused both before: the query had to
    use commitMode=task). A store that does not open is named, without its password,
    and no file of the key is left behind."""
    from cryptography.hazmat.primitives.serialization import (
        BestAvailableEncryption,
        Encoding,
        PrivateFormat,
        pkcs12,
    )

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    key, certificate = _client_certificate()
    tls = {"bootstrap.servers": "a:9093", "security.protocol": "SSL"}
    sealed = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"k1"))
    pem = {
        "ssl.certificate.pem": certificate.public_bytes(Encoding.PEM).decode(),
        "ssl.key.pem": sealed.decode(),
        "ssl.key.password": "k1",
    }
    store = tmp_path / "client.p12"
    encryption = BestAvailableEncryption(b"s3cret-store")
    store.write_bytes(
        pkcs12.serialize_key_and_certificates(b"c", key, certificate, None, encryption)
    )
    keystore = {"ssl.keystore.location": str(store), "ssl.keystore.password": "s3cret-store"}
    for client in (pem, keystore):  # loaded (a real handshake: test_kafka_sasl_pipelines.py)
        assert to_kafka_python({**tls, **client})["ssl_context"].check_hostname
    with pytest.raises(ConfigError, match=r"'kafka\.ssl\.certificate\.pem'.*do not load"):
        to_kafka_python({**tls, **pem, "ssl.certificate.pem": _pem(_client_certificate()[1])})
    with pytest.raises(ConfigError, match=r"'kafka\.ssl\.keystore\.location'.*does not open"):
        to_kafka_python({**tls, **keystore, "ssl.keystore.password": "wrong-one"})
    with pytest.raises(ConfigError, match=r"'kafka\.ssl\.key\.pem' does not open") as refused:
        to_kafka_python({**tls, **pem, "ssl.key.password": "k2-wrong"})
    assert "k2-wrong" not in str(refused.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client.p12"], "no key left"
