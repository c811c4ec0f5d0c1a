"""Driver: OAUTHBEARER tokens for the driver's transaction client, got as librdkafka gets
them from the same ``kafka.sasl.oauthbearer.*`` settings.

librdkafka (the tasks) and kafka-python (the driver's commit) each sign in on their own,
so the driver needs a token from the same settings. Two of librdkafka's ways are taken:

- ``sasl.oauthbearer.method=oidc`` with the client credentials grant (its default):
  a form POST of ``grant_type=client_credentials`` (and ``scope``) to
  ``sasl.oauthbearer.token.endpoint.url``, the client id and secret in HTTP Basic
  authentication, the ``access_token`` of the answer kept until 80% of its life (the
  JWT's ``exp``, else the answer's ``expires_in``) has passed. Confluent Cloud,
  Strimzi with Keycloak and Redpanda sign in so.
- ``method=default`` with ``sasl.oauthbearer.config`` (``principal=... scope=...
  lifeSeconds=... extension_<k>=<v>``): an unsecured JWT (``alg`` none), for brokers
  whose listener takes such tokens (development, tests).

Other grants (``jwt-bearer``), cloud metadata sign-in, or a token refresh callback
(which no Spark option can carry) are refused at start, naming the fallback mode.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from kafka.net.sasl.oauth import AbstractTokenProvider

from eos_connectors.core.errors import ConfigError, ServiceUnavailableError, keeping_code
from eos_connectors.core.kafka_config import OAUTH_SETTINGS

CLIENT_CREDENTIALS = "client_credentials"
#: A token is used until this share of its life has passed, then fetched again.
REFRESH_AT = 0.8
TIMEOUT_SECONDS = 30.0


class OAuthTokens(AbstractTokenProvider):  # type: ignore[misc]
    """Driver: the tokens kafka-python signs in with (``sasl_oauth_token_provider``)."""

    def __init__(self, settings: Mapping[str, Any], fallback: str) -> None:
        super().__init__()
        self._settings = {k: str(v) for k, v in settings.items() if k in OAUTH_SETTINGS}
        self._oidc = self._settings.get("sasl.oauthbearer.method", "default").lower() == "oidc"
        self._fallback = fallback
        self._lock = threading.Lock()
        self._token: str | None = None
        self._refresh_at = 0.0
        self._check()

    def __repr__(self) -> str:  # never the client secret
        return f"OAuthTokens(method={'oidc' if self._oidc else 'default'})"

    def _check(self) -> None:
        """ConfigError for what this module cannot do, before any connection."""
        s = self._settings
        if not self._oidc:
            if "sasl.oauthbearer.config" not in s:
                raise ConfigError(
                    "SASL mechanism OAUTHBEARER without sasl.oauthbearer.method=oidc needs "
                    "kafka.sasl.oauthbearer.config (an unsecured token's principal=...); a "
                    "token refresh callback cannot be given as a Spark option. Set "
                    f"kafka.sasl.oauthbearer.method=oidc, or use {self._fallback}."
                )
            return
        grant = s.get("sasl.oauthbearer.grant.type", CLIENT_CREDENTIALS)
        if grant != CLIENT_CREDENTIALS:
            raise ConfigError(
                f"Setting 'kafka.sasl.oauthbearer.grant.type' {grant!r} cannot be honoured by "
                f"the driver's transaction client (it takes {CLIENT_CREDENTIALS}); use "
                f"{self._fallback}."
            )
        if "sasl.oauthbearer.token.endpoint.url" not in s:
            raise ConfigError(
                "sasl.oauthbearer.method=oidc needs kafka.sasl.oauthbearer.token.endpoint.url."
            )
        if self._client()[0] is None:
            raise ConfigError(
                "sasl.oauthbearer.method=oidc needs kafka.sasl.oauthbearer.client.id and "
                "kafka.sasl.oauthbearer.client.secret."
            )

    def token(self) -> str:
        """Driver: a token with life left, fetched again past :data:`REFRESH_AT`."""
        with self._lock:
            now = time.time()
            if self._token is None or now >= self._refresh_at:
                token, lifetime = self._fetch() if self._oidc else self._unsecured(now)
                self._token, self._refresh_at = token, now + REFRESH_AT * lifetime
            return self._token

    def extensions(self) -> dict[str, str]:
        """``sasl.oauthbearer.extensions`` (oidc: ``k=v,k2=v2``), or the
        ``extension_<k>=<v>`` entries of ``sasl.oauthbearer.config``."""
        if self._oidc:
            text = self._settings.get("sasl.oauthbearer.extensions", "")
            pairs = [_pair(p) for p in text.split(",") if "=" in p]
        else:
            prefix = "extension_"
            fields = _config_fields(self._settings["sasl.oauthbearer.config"])
            pairs = [(k.removeprefix(prefix), v) for k, v in fields if k.startswith(prefix)]
        return {k.strip(): v.strip() for k, v in pairs}

    def _client(self) -> tuple[str | None, str | None]:
        s = self._settings
        client = s.get("sasl.oauthbearer.client.id") or s.get(
            "sasl.oauthbearer.client.credentials.client.id"
        )
        secret = s.get("sasl.oauthbearer.client.secret") or s.get(
            "sasl.oauthbearer.client.credentials.client.secret"
        )
        return (client, secret) if client and secret else (None, None)

    def _fetch(self) -> tuple[str, float]:
        """The client credentials grant: the token and its lifetime in seconds."""
        url = self._settings["sasl.oauthbearer.token.endpoint.url"]
        if not url.startswith(("https://", "http://")):
            raise ConfigError(
                "Setting 'kafka.sasl.oauthbearer.token.endpoint.url' must be an https:// (or "
                "http://) URL."
            )
        client, secret = self._client()
        form = {"grant_type": CLIENT_CREDENTIALS}
        if "sasl.oauthbearer.scope" in self._settings:
            form["scope"] = self._settings["sasl.oauthbearer.scope"]
        basic = base64.b64encode(f"{client}:{secret}".encode()).decode()
        request = urllib.request.Request(  # noqa: S310 (an https or http URL, checked above)
            url,
            data=urllib.parse.urlencode(form).encode(),
            headers={
                "Authorization": f"Basic {basic}",
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(  # noqa: S310
                request, timeout=TIMEOUT_SECONDS, context=self._https()
            ) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise keeping_code(
                ConfigError(
                    f"The token endpoint ({_where(url)}) refused the driver's client "
                    f"credentials: HTTP {exc.code}. Check kafka.sasl.oauthbearer.client.id, "
                    ".client.secret and .scope."
                ),
                exc,
            ) from None
        except (OSError, ValueError) as exc:
            raise keeping_code(
                ServiceUnavailableError(
                    f"The token endpoint ({_where(url)}) did not give the driver a token: "
                    f"{type(exc).__name__}."
                ),
                exc,
            ) from None
        token = body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise ConfigError(f"The token endpoint ({_where(url)}) answered without access_token.")
        return token, _lifetime(token, body.get("expires_in"))

    def _https(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self._settings.get("https.ca.location"))
        if "https.ca.pem" in self._settings:
            context.load_verify_locations(cadata=self._settings["https.ca.pem"])
        return context

    def _unsecured(self, now: float) -> tuple[str, float]:
        """An unsecured JWT as librdkafka makes it from ``sasl.oauthbearer.config``."""
        fields = dict(_config_fields(self._settings["sasl.oauthbearer.config"]))
        if "principal" not in fields:
            raise ConfigError(
                "kafka.sasl.oauthbearer.config needs principal=<name> (an unsecured token)."
            )
        life = float(fields.get("lifeSeconds", 3600))
        claims: dict[str, Any] = {
            fields.get("principalClaimName", "sub"): fields["principal"],
            "iat": int(now),
            "exp": int(now + life),
        }
        if "scope" in fields:
            claims[fields.get("scopeClaimName", "scope")] = fields["scope"].split(",")
        header = _b64(json.dumps({"alg": "none"}).encode())
        return f"{header}.{_b64(json.dumps(claims).encode())}.", life


def _config_fields(text: str) -> list[tuple[str, str]]:
    """``sasl.oauthbearer.config``'s space-separated ``name=value`` fields."""
    return [_pair(p) for p in text.split() if "=" in p]


def _pair(text: str) -> tuple[str, str]:
    name, _, value = text.partition("=")
    return name, value


def _lifetime(token: str, expires_in: object) -> float:
    """Seconds the token lives: its JWT ``exp``, else ``expires_in``, else an hour."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        return max(float(claims["exp"]) - time.time(), 1.0)
    except (IndexError, KeyError, TypeError, ValueError):
        pass
    try:
        return max(float(expires_in), 1.0)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 3600.0


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _where(url: str) -> str:
    """The endpoint's scheme, host and path, never its query (which may carry a key)."""
    parsed = urllib.parse.urlsplit(url)
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.hostname}{port}{parsed.path}"
