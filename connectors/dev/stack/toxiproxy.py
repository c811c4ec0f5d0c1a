"""Toxiproxy, a real TCP proxy that injects network faults, between the pipeline and a
service: connections reset mid-transaction, latency spikes, a service cut off for a while.

Built once from the Go module proxy (``go install``) into the per-user cache, because
it is a single static binary with an HTTP API and no dependencies; Shopify's own
chaos tests use it. Listens on loopback only.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eos_connectors.core.errors import StackError
from eos_connectors.dev.stack.process import (
    LOOPBACK,
    free_port,
    pid_alive,
    require_binary,
    run,
    spawn,
    terminate,
    wait_until,
)
from eos_connectors.ops.cache import building, cache_root

TOXIPROXY_MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server"
TOXIPROXY_VERSION = "v2.5.0"
GO_HINT = "Install Go 1.22+ (https://go.dev/dl/), which builds Toxiproxy from its module."


def ensure_binary() -> Path:
    """The toxiproxy server, built once with ``go install`` into the cache."""
    where = cache_root() / f"toxiproxy-{TOXIPROXY_VERSION}"
    binary = where / "toxiproxy-server"
    if binary.exists():
        return binary
    with building(where.with_name(f"{where.name}.lock")):  # two builds shared one GOPATH
        if not binary.exists():
            _build(where, binary)
    return binary


def _build(where: Path, binary: Path) -> None:
    standard = Path("/usr/local/go/bin/go")  # where Go's own installer puts it
    go = str(standard) if not shutil.which("go") and standard.exists() else None
    go = go or require_binary("go", GO_HINT)
    where.mkdir(parents=True, exist_ok=True)
    build = where / "build"
    env = {
        **os.environ,
        "GOBIN": str(build / "bin"),
        "GOPATH": str(build / "gopath"),
        "GOCACHE": str(build / "cache"),
        "GOFLAGS": "-modcacherw -buildvcs=false",
    }
    command = [go, "install", f"{TOXIPROXY_MODULE}@{TOXIPROXY_VERSION}"]
    run(
        command,
        what=f"Building Toxiproxy {TOXIPROXY_VERSION} from its module",
        timeout=900,
        env=env,
    )
    (build / "bin" / "server").rename(binary)
    shutil.rmtree(build, ignore_errors=True)


@dataclass(frozen=True)
class Proxy:
    """One proxied service: clients connect to ``listen`` instead of ``upstream``."""

    name: str
    listen: str  # host:port
    upstream: str  # host:port


class Toxiproxy:
    """A toxiproxy server of its own under ``where``: proxies and toxics by its API."""

    def __init__(self, where: Path) -> None:
        self.dir = where
        self.pid: int | None = None
        self.port = 0

    def start(self) -> None:
        binary = ensure_binary()
        self.port = free_port()
        self.dir.mkdir(parents=True, exist_ok=True)
        log = self.dir / "toxiproxy.log"
        argv = [str(binary), "-host", LOOPBACK, "-port", str(self.port)]
        self.pid = spawn(argv, log, self.dir)
        pid = self.pid
        wait_until(
            self._answers,
            timeout=30,
            what=f"Toxiproxy on {LOOPBACK}:{self.port}",
            alive=lambda: pid_alive(pid),
            log_path=log,
        )

    def stop(self) -> None:
        if self.pid is not None:
            terminate(self.pid, timeout=10)
            self.pid = None

    def proxy(self, name: str, upstream: str, listen: str | None = None) -> Proxy:
        """A proxy to ``upstream`` (host:port) on ``listen``, else a free loopback port."""
        listen = listen or f"{LOOPBACK}:{free_port()}"
        body = {"name": name, "listen": listen, "upstream": upstream, "enabled": True}
        self._call("POST", "/proxies", body)
        return Proxy(name, listen, upstream)

    def add_toxic(
        self, proxy: str, kind: str, stream: str = "downstream", **attributes: int
    ) -> str:
        """Add a toxic (``latency``, ``reset_peer``, ``timeout``, ...) to every connection
        of ``proxy`` in ``stream``; return its name."""
        name = f"{kind}-{stream}"
        body = {"name": name, "type": kind, "stream": stream, "toxicity": 1.0}
        self._call("POST", f"/proxies/{proxy}/toxics", {**body, "attributes": attributes})
        return name

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")

    def set_enabled(self, proxy: str, enabled: bool) -> None:
        """Disabled: every open connection is closed and new ones are refused."""
        self._call("POST", f"/proxies/{proxy}", {"enabled": enabled})

    def _answers(self) -> bool:
        try:
            self._call("GET", "/version")
        except StackError:
            return False
        return True

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        connection = http.client.HTTPConnection(LOOPBACK, self.port, timeout=10)
        try:
            data = json.dumps(body) if body is not None else None
            connection.request(method, path, data, {"Content-Type": "application/json"})
            response = connection.getresponse()
            text = response.read().decode()
        except OSError as exc:
            raise StackError(f"Toxiproxy {method} {path}: {exc}") from exc
        finally:
            connection.close()
        if response.status >= 300:
            raise StackError(f"Toxiproxy {method} {path}: {response.status} {text.strip()}")
        return json.loads(text) if text.strip().startswith(("{", "[")) else text
