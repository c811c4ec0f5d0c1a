"""The driver's OIDC tokens against the stack: the request over HTTPS checks the
endpoint's certificate against ``https.ca.location`` (librdkafka's setting), as
librdkafka does; and the batch commit's start check names a refused or unreachable
token endpoint at once. ~1 s."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.serialization import pkcs12

from eos_connectors.core.errors import ConfigError, ServiceUnavailableError
from eos_connectors.core.oauth_token import OAuthTokens
from eos_connectors.dev.endpoints import KafkaSasl
from eos_connectors.sinks.kafka.coordinator import check_batch_commit
from tests.oauth_util import token_endpoint

pytestmark = pytest.mark.services


def _server_context(sasl: KafkaSasl, tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    """The broker's key and certificate (the stack's, signed by its CA) as a server
    context, and the CA's PEM file."""
    folder = Path(sasl.truststore).parent
    key, certificate, chain = pkcs12.load_key_and_certificates(
        (folder / "broker.p12").read_bytes(), sasl.truststore_password.encode()
    )
    assert key is not None and certificate is not None
    pem = tmp_path / "server.pem"
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        + certificate.public_bytes(serialization.Encoding.PEM)
        + b"".join(c.public_bytes(serialization.Encoding.PEM) for c in chain)
    )
    os.chmod(pem, 0o600)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pem)
    return context, folder / "ca.pem"


def test_the_token_endpoints_certificate_is_checked_against_the_named_ca(
    sasl: KafkaSasl, tmp_path: Path
) -> None:
    if not sasl.truststore or not (Path(sasl.truststore).parent / "ca.pem").exists():
        pytest.skip("this broker has no TLS material of the stack's")
    context, ca = _server_context(sasl, tmp_path)
    with token_endpoint(tls=context) as idp:
        settings = {k.removeprefix("kafka."): v for k, v in idp.options("h:1").items()}
        trusted = OAuthTokens({**settings, "https.ca.location": str(ca)}, "commitMode=task")
        assert trusted.token().count(".") == 2
        assert len(idp.requests) == 1
        with pytest.raises(ServiceUnavailableError, match="did not give the driver a token") as e:
            OAuthTokens(settings, "commitMode=task").token()
        assert idp.url.split("?")[0] in str(e.value) and idp.client_secret not in str(e.value)


def test_a_refused_or_unreachable_token_endpoint_is_named_at_the_start(sasl: KafkaSasl) -> None:
    """kafka-python retries a token that cannot be had, silently, until its timeout: the
    start check waited 30 s and then said the driver could not reach the Kafka cluster."""
    if not sasl.oauth_bootstrap:
        pytest.skip("this broker has no OAUTHBEARER listener; `eos stack up` starts one")
    with token_endpoint() as idp:
        settings = {
            k.removeprefix("kafka."): v for k, v in idp.options(sasl.oauth_bootstrap).items()
        }
        check_batch_commit(settings, "eos-oauth-check", timeout_s=10)  # signs in
        wrong = {**settings, "sasl.oauthbearer.client.secret": "not-it"}
        with pytest.raises(ConfigError, match="refused the driver's client credentials: HTTP 401"):
            check_batch_commit(wrong, "eos-oauth-check", timeout_s=10)
    gone = {**settings, "sasl.oauthbearer.token.endpoint.url": "http://127.0.0.1:1/token"}
    with pytest.raises(ServiceUnavailableError, match="did not give the driver a token"):
        check_batch_commit(gone, "eos-oauth-check", timeout_s=10)
