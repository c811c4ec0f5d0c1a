"""Network faults between the pipeline and a service, through a real TCP proxy
(:mod:`eos_connectors.dev.stack.toxiproxy`).

The pipeline reaches each service named in a plan's ``network_faults`` through its own
proxy; the harness's checks reach the services directly. A fault is ``service:kind``:

- ``reset``: every connection is reset (TCP RST) for a few seconds, transactions and
  scripts in flight included; new connections are reset as soon as they send;
- ``latency``: every answer is held back several seconds, longer than a batch;
- ``cut``: the service is unreachable for a few seconds: open connections closed, new
  ones refused.

Each must end with each input record written once and nothing left in doubt, or with a
clear failure that restarting the query resolves (the harness's pipeline restarts a
failed query, as an operator would).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.stack.toxiproxy import Toxiproxy

NETWORK_SERVICES = ("postgres", "redis")
NETWORK_KINDS = ("reset", "latency", "cut")
FAULT_SECONDS = 4.0
STREAMS = ("upstream", "downstream")
LATENCY_MS = 6000


def parse_fault(text: str) -> tuple[str, str] | None:
    """``service:kind`` as a pair, None when either part is unknown."""
    service, _, kind = text.partition(":")
    if service in NETWORK_SERVICES and kind in NETWORK_KINDS:
        return service, kind
    return None


def through(url: str, listen: str) -> str:
    """``url`` with its host and port replaced by ``listen``, credentials kept."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@{listen}" if credentials else listen
    return urlunsplit(parts._replace(netloc=netloc))


def upstream(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port}"


@dataclass
class NetworkFaults:
    """A toxiproxy with one proxy per service; :meth:`inject` runs one fault."""

    proxy: Toxiproxy
    services: tuple[str, ...]

    @classmethod
    def start(
        cls, where: Path, endpoints: Endpoints, services: tuple[str, ...]
    ) -> tuple[NetworkFaults, Endpoints]:
        """Proxies for ``services``; the endpoints the pipeline uses through them."""
        proxy = Toxiproxy(where)
        proxy.start()
        piped = endpoints
        if "postgres" in services:
            made = proxy.proxy("postgres", upstream(endpoints.postgres_dsn))
            piped = replace(piped, postgres_dsn=through(endpoints.postgres_dsn, made.listen))
        if "redis" in services:
            made = proxy.proxy("redis", upstream(endpoints.redis_url))
            piped = replace(piped, redis_url=through(endpoints.redis_url, made.listen))
        return cls(proxy, services), piped

    def inject(self, service: str, kind: str) -> None:
        """Run one fault for ``FAULT_SECONDS`` (a latency fault: until its answers came)."""
        if kind == "cut":
            self.proxy.set_enabled(service, False)
            time.sleep(FAULT_SECONDS)
            self.proxy.set_enabled(service, True)
            return
        if kind == "reset":
            names = [self.proxy.add_toxic(service, "reset_peer", s, timeout=0) for s in STREAMS]
        else:
            names = [self.proxy.add_toxic(service, "latency", "downstream", latency=LATENCY_MS)]
        time.sleep(FAULT_SECONDS)
        for name in names:
            self.proxy.remove_toxic(service, name)

    def stop(self) -> None:
        self.proxy.stop()
