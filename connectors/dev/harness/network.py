"""Network faults between the pipeline and a service, through a real TCP proxy
(:mod:`eos_connectors.dev.stack.toxiproxy`).

The pipeline reaches each service named in a plan's ``network_faults`` through its own
proxy; the harness's checks reach the services directly. Kafka's brokers each have a
listener advertised at its proxy's address (the stack's ``PROXIED`` listener), so a
client that bootstraps through the proxies also reaches every partition leader and
coordinator through them. A fault is ``service:kind``:

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

from eos_connectors.core.errors import StackError
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.stack.toxiproxy import Toxiproxy

NETWORK_SERVICES = ("kafka", "postgres", "redis")
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
    brokers: int = 0  # Kafka proxies, one per broker

    @classmethod
    def start(
        cls, where: Path, endpoints: Endpoints, services: tuple[str, ...]
    ) -> tuple[NetworkFaults, Endpoints]:
        """Proxies for ``services``; the endpoints the pipeline uses through them."""
        if "kafka" in services and not endpoints.kafka_proxied:
            raise StackError(
                "--network-fault kafka:... needs brokers with a proxied listener: restart "
                "the stack's Kafka (`eos stack down`, then `eos stack up`) to add one."
            )
        proxy = Toxiproxy(where)
        proxy.start()
        piped = endpoints
        if "kafka" in services:
            for node, (listen, bound) in enumerate(endpoints.kafka_proxied, 1):
                proxy.proxy(f"kafka-{node}", bound, listen=listen)
            bootstrap = ",".join(listen for listen, _ in endpoints.kafka_proxied)
            piped = replace(piped, kafka_bootstrap=bootstrap, kafka_sasl=None)
        if "postgres" in services:
            made = proxy.proxy("postgres", upstream(endpoints.postgres_dsn))
            piped = replace(piped, postgres_dsn=through(endpoints.postgres_dsn, made.listen))
        if "redis" in services:
            made = proxy.proxy("redis", upstream(endpoints.redis_url))
            piped = replace(piped, redis_url=through(endpoints.redis_url, made.listen))
        brokers = len(endpoints.kafka_proxied) if "kafka" in services else 0
        return cls(proxy, services, brokers), piped

    def proxies(self, service: str) -> list[str]:
        """The proxies of ``service``: one per Kafka broker, one for a store."""
        if service == "kafka":
            return [f"kafka-{node}" for node in range(1, self.brokers + 1)]
        return [service]

    def inject(self, service: str, kind: str) -> None:
        """Run one fault for ``FAULT_SECONDS`` (a latency fault: until its answers came),
        on every proxy of ``service`` at once."""
        proxies = self.proxies(service)
        if kind == "cut":
            for proxy in proxies:
                self.proxy.set_enabled(proxy, False)
            time.sleep(FAULT_SECONDS)
            for proxy in proxies:
                self.proxy.set_enabled(proxy, True)
            return
        added = []
        for proxy in proxies:
            if kind == "reset":
                names = [self.proxy.add_toxic(proxy, "reset_peer", s, timeout=0) for s in STREAMS]
            else:
                names = [self.proxy.add_toxic(proxy, "latency", "downstream", latency=LATENCY_MS)]
            added += [(proxy, name) for name in names]
        time.sleep(FAULT_SECONDS)
        for proxy, name in added:
            self.proxy.remove_toxic(proxy, name)

    def stop(self) -> None:
        self.proxy.stop()
