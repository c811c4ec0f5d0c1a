"""A token endpoint for OAUTHBEARER tests: the client credentials grant (RFC 6749 4.4)
on loopback, issuing unsecured tokens (``alg`` none) that the stack's OAUTHBEARER
listener takes, as its broker's default validator does. Production brokers check signed
tokens against their identity provider's keys; what the clients do (ask, keep, refresh,
sign in) is the same."""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class TokenEndpoint:
    url: str
    client_id: str
    client_secret: str
    life_seconds: int
    subject: str
    #: each request's form body, as the endpoint got it
    requests: list[str] = field(default_factory=list)

    def options(self, bootstrap: str) -> dict[str, str]:
        """A source's or sink's ``kafka.*`` options signing in through this endpoint."""
        return {
            "kafka.bootstrap.servers": bootstrap,
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "OAUTHBEARER",
            "kafka.sasl.oauthbearer.method": "oidc",
            "kafka.sasl.oauthbearer.client.id": self.client_id,
            "kafka.sasl.oauthbearer.client.secret": self.client_secret,
            "kafka.sasl.oauthbearer.token.endpoint.url": self.url,
            "kafka.sasl.oauthbearer.scope": "kafka",
        }

    def java_options(self, bootstrap: str) -> dict[str, str]:
        """The same sign-in as a Java job's ``kafka.*`` options give it (KIP-768)."""
        login = (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
            f'clientId="{self.client_id}" clientSecret="{self.client_secret}" scope="kafka";'
        )
        return {
            "kafka.bootstrap.servers": bootstrap,
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "OAUTHBEARER",
            "kafka.sasl.login.callback.handler.class": (
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"
            ),
            "kafka.sasl.oauthbearer.token.endpoint.url": self.url,
            "kafka.sasl.jaas.config": login,
        }


def unsecured_token(subject: str, life_seconds: int) -> str:
    now = int(time.time())
    claims = {"sub": subject, "iat": now, "exp": now + life_seconds, "scope": "kafka"}
    parts = ({"alg": "none"}, claims)
    return ".".join(_b64(json.dumps(p).encode()) for p in parts) + "."


@contextmanager
def token_endpoint(
    subject: str = "eos", life_seconds: int = 600, tls: ssl.SSLContext | None = None
) -> Iterator[TokenEndpoint]:
    """A running endpoint whose one client is ``cid``/``csecret-...``; over HTTPS with
    ``tls`` (a server context)."""
    endpoint = TokenEndpoint("", "cid", f"csecret-{time.time_ns()}", life_seconds, subject)
    expected = (
        "Basic "
        + base64.b64encode(f"{endpoint.client_id}:{endpoint.client_secret}".encode()).decode()
    )

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
            endpoint.requests.append(body)
            if self.headers.get("Authorization") != expected:
                self._answer(401, {"error": "invalid_client"})
                return
            if "grant_type=client_credentials" not in body:
                self._answer(400, {"error": "unsupported_grant_type"})
                return
            token = unsecured_token(endpoint.subject, endpoint.life_seconds)
            self._answer(200, {"access_token": token, "token_type": "bearer"})

        def _answer(self, status: int, body: dict[str, str]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    scheme = "https" if tls is not None else "http"
    endpoint.url = f"{scheme}://127.0.0.1:{server.server_port}/oauth2/token"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield endpoint
    finally:
        server.shutdown()
        server.server_close()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
