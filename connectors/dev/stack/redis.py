"""Redis from the OS packages, persisting every write to its append-only file."""

from __future__ import annotations

from pathlib import Path

from eos_connectors.dev.stack.process import (
    LOOPBACK,
    free_port,
    pid_alive,
    require_binary,
    spawn,
    wait_until,
)
from eos_connectors.dev.stack.service import Service, ServiceRecord

# Server settings shared with docker-compose.yml (a test checks that they match).
REDIS_SETTINGS: dict[str, str] = {
    "appendonly": "yes",
    "appendfsync": "always",
}

INSTALL_HINT = (
    "Install the Redis server (Debian: 'apt-get install -y redis-server'), "
    "or run 'make bootstrap', which installs it."
)


class RedisService(Service):
    name = "redis"

    @property
    def marker(self) -> Path:
        return self.dir / "redis.conf"

    def check_installed(self) -> None:
        require_binary("redis-server", INSTALL_HINT)

    def start(self, previous: ServiceRecord | None) -> ServiceRecord:
        server = require_binary("redis-server", INSTALL_HINT)
        port = free_port(previous.ports[0] if previous else None)
        self._write_config(port)
        pid = spawn([server, str(self.marker)], self.log_path, self.dir)
        record = ServiceRecord(self.name, pid, (port,), f"redis://{LOOPBACK}:{port}/0")
        wait_until(
            lambda: self.answers(record),
            timeout=30,
            what=f"Redis on port {port}",
            alive=lambda: pid_alive(pid),  # ours: just spawned (its title may be mid-rewrite)
            log_path=self.log_path,
        )
        return record

    def answers(self, record: ServiceRecord) -> bool:
        import redis

        try:
            with redis.Redis.from_url(record.endpoint, socket_timeout=2) as client:
                return bool(client.ping())
        except redis.RedisError:
            return False

    def _write_config(self, port: int) -> None:
        data = self.dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        settings = {
            **REDIS_SETTINGS,
            "bind": LOOPBACK,
            "port": str(port),
            "dir": str(data),
            "daemonize": "no",
            "protected-mode": "yes",
            "save": '""',
            # The config path in the process title lets `eos stack down` recognise its own server.
            "proc-title-template": '"{title} {listen-addr} {config-file}"',
        }
        self.marker.write_text("".join(f"{k} {v}\n" for k, v in settings.items()))
