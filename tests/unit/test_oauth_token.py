"""The driver's OAUTHBEARER tokens (eos_connectors.core.oauth_token), against a token
endpoint on loopback (tests/oauth_util.py): asked as librdkafka asks, kept, refreshed,
refused by name. No Kafka (the Spark test signs in for real). Cost: ~1.5 s."""

from __future__ import annotations

import base64
import json
import time

import pytest

from eos_connectors.core.errors import ConfigError
from eos_connectors.core.kafka_config import to_kafka_python
from eos_connectors.core.oauth_token import OAuthTokens
from tests.oauth_util import token_endpoint


def _claims(token: str) -> dict[str, object]:
    part = token.split(".")[1]
    decoded: dict[str, object] = json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))
    return decoded


def _settings(options: dict[str, str]) -> dict[str, str]:
    return {k.removeprefix("kafka."): v for k, v in options.items()}


def test_oidc_asks_as_librdkafka_does_keeps_the_token_and_refreshes_it() -> None:
    with token_endpoint(life_seconds=1) as endpoint:
        settings = _settings(endpoint.options("127.0.0.1:1"))
        kwargs = to_kafka_python(settings)
        tokens = kwargs["sasl_oauth_token_provider"]
        assert kwargs["sasl_mechanism"] == "OAUTHBEARER" and isinstance(tokens, OAuthTokens)
        first = tokens.token()
        assert tokens.token() == first, "kept while it has life left"
        assert endpoint.requests == ["grant_type=client_credentials&scope=kafka"]
        assert _claims(first)["sub"] == "eos"
        time.sleep(0.9)  # past 80% of its one second
        tokens.token()
        assert len(endpoint.requests) == 2, "fetched again"
        assert endpoint.client_secret not in repr(kwargs)


def test_a_refused_client_is_named_without_its_secret() -> None:
    with token_endpoint() as endpoint:
        settings = {**_settings(endpoint.options("h:1")), "sasl.oauthbearer.client.secret": "no"}
        with pytest.raises(ConfigError, match="HTTP 401") as refused:
            OAuthTokens(settings, "commitMode=task").token()
    assert "client.id" in str(refused.value) and "'no'" not in str(refused.value)


def test_an_unsecured_token_is_made_from_the_config_with_its_extensions() -> None:
    settings = {
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.config": "principal=alice scope=a,b lifeSeconds=60 extension_x=1",
    }
    tokens = OAuthTokens(settings, "commitMode=task")
    token = tokens.token()
    header = json.loads(base64.urlsafe_b64decode(token.split(".")[0] + "=="))
    assert header == {"alg": "none"} and token.endswith(".")
    claims = _claims(token)
    assert claims["sub"] == "alice" and claims["scope"] == ["a", "b"]
    assert int(str(claims["exp"])) - int(str(claims["iat"])) == 60
    assert tokens.extensions() == {"x": "1"}


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        (
            {
                "sasl.oauthbearer.method": "oidc",
                "sasl.oauthbearer.client.id": "c",
                "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
            },
            "client.secret",
        ),
        (
            {
                "sasl.oauthbearer.method": "oidc",
                "sasl.oauthbearer.grant.type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
                "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
            },
            "commitMode=task",
        ),
        ({"sasl.oauthbearer.method": "default"}, "sasl.oauthbearer.config"),
    ],
)
def test_what_the_driver_cannot_do_is_refused_at_start(
    settings: dict[str, str], named: str
) -> None:
    base = {"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL"}
    with pytest.raises(ConfigError, match=named.replace(".", r"\.")):
        to_kafka_python({**base, "sasl.mechanism": "OAUTHBEARER", **settings})
