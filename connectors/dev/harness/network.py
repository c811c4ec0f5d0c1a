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

The step fault ``postgres-partition`` (see :mod:`.plan`; a Spark standalone cluster only)
cuts the Spark driver alone off PostgreSQL for ``PARTITION_SECONDS`` once a task of a
batch has prepared, while the executors' tasks still reach the server. PostgreSQL then has two
proxies on one port: the tasks' on 127.0.0.1 (the address in the pipeline's DSN) and the
driver's on 127.0.0.2. The pipeline's process, and so the driver's JVM and the Python
workers it starts (they run the sinks' driver hooks), has ``PGHOSTADDR`` set to
127.0.0.2, which libpq connects to while the DSN's host stays what it names; executors,
started by the cluster's workers, have no such variable and connect to the DSN's own
address. In local mode the tasks are children of the driver's JVM and would inherit the
variable, hence cluster only.

Each must end with each input record written once and nothing left in doubt, or with a
clear failure that restarting the query resolves (the harness's pipeline restarts a
failed query, as an operator would).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from eos_connectors.core.errors import StackError
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.stack.process import LOOPBACK, free_port
from eos_connectors.dev.stack.toxiproxy import Toxiproxy

NETWORK_SERVICES = ("kafka", "postgres", "redis")
NETWORK_KINDS = ("reset", "latency", "cut")
FAULT_SECONDS = 4.0
PARTITION_SECONDS = 8.0  # within the driver's commit retries (COMMIT_RETRY_SECONDS)
DRIVER_ADDRESS = "127.0.0.2"  # loopback too: the whole 127/8 is
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
    driver_apart: bool = False  # PostgreSQL: the driver has a proxy of its own

    @classmethod
    def start(
        cls,
        where: Path,
        endpoints: Endpoints,
        services: tuple[str, ...],
        driver_apart: bool = False,
    ) -> tuple[NetworkFaults, Endpoints]:
        """Proxies for ``services``; the endpoints the pipeline uses through them. With
        ``driver_apart``, PostgreSQL's driver proxy too (see :meth:`driver_env`)."""
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
        driver_apart = driver_apart and "postgres" in services
        if "postgres" in services:
            server = upstream(endpoints.postgres_dsn)
            port = _port_free_on_both() if driver_apart else free_port()
            made = proxy.proxy("postgres", server, listen=f"{LOOPBACK}:{port}")
            if driver_apart:
                proxy.proxy("postgres-driver", server, listen=f"{DRIVER_ADDRESS}:{port}")
            piped = replace(piped, postgres_dsn=through(endpoints.postgres_dsn, made.listen))
        if "redis" in services:
            made = proxy.proxy("redis", upstream(endpoints.redis_url))
            piped = replace(piped, redis_url=through(endpoints.redis_url, made.listen))
        brokers = len(endpoints.kafka_proxied) if "kafka" in services else 0
        return cls(proxy, services, brokers, driver_apart), piped

    def driver_env(self) -> dict[str, str]:
        """Environment of the pipeline's process (the Spark driver): with the driver
        apart, libpq connects to the driver's PostgreSQL proxy."""
        return {"PGHOSTADDR": DRIVER_ADDRESS} if self.driver_apart else {}

    def proxies(self, service: str) -> list[str]:
        """The proxies of ``service``: one per Kafka broker, one for a store (two for
        PostgreSQL with the driver apart)."""
        if service == "kafka":
            return [f"kafka-{node}" for node in range(1, self.brokers + 1)]
        if service == "postgres" and self.driver_apart:
            return ["postgres", "postgres-driver"]
        return [service]

    def partition_driver(self, meanwhile: Callable[[], None]) -> None:
        """Cut the driver alone off PostgreSQL for ``PARTITION_SECONDS``; ``meanwhile``
        runs once it is cut off."""
        assert self.driver_apart, "the driver has no PostgreSQL proxy of its own"
        self._disable(["postgres-driver"], PARTITION_SECONDS, meanwhile)

    def inject(self, service: str, kind: str) -> None:
        """Run one fault for ``FAULT_SECONDS`` (a latency fault: until its answers came),
        on every proxy of ``service`` at once."""
        proxies = self.proxies(service)
        if kind == "cut":
            self._disable(proxies, FAULT_SECONDS)
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

    def _disable(
        self, proxies: list[str], seconds: float, meanwhile: Callable[[], None] | None = None
    ) -> None:
        for proxy in proxies:
            self.proxy.set_enabled(proxy, False)
        if meanwhile is not None:
            meanwhile()
        time.sleep(seconds)
        for proxy in proxies:
            self.proxy.set_enabled(proxy, True)

    def stop(self) -> None:
        self.proxy.stop()


def _port_free_on_both() -> int:
    """A port free on 127.0.0.1 and on :data:`DRIVER_ADDRESS` alike."""
    for _ in range(20):
        port = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((DRIVER_ADDRESS, port))
            except OSError:
                continue
        return port
    raise StackError(f"No port free on both {LOOPBACK} and {DRIVER_ADDRESS}.")
