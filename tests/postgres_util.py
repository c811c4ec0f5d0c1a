"""Throw-away PostgreSQL servers for tests that need one configured differently from the
stack's: a cluster of their own, under a directory the server's OS user can reach."""

from __future__ import annotations

import os
import pwd
import shutil
import uuid
from collections.abc import Generator
from pathlib import Path

from eos_connectors.dev.stack.postgres import SERVER_OS_USER, PostgresService


def postgres_server(
    settings: dict[str, str] | None = None, standby: bool = False
) -> Generator[str, None, None]:
    """The DSN of a fresh cluster with ``settings``, removed afterwards (~1.5 s to start).

    ``standby``: the cluster is stopped and started again with ``standby.signal`` and no
    primary, so it replays nothing and serves read-only sessions at once, as a hot
    standby (or a managed service's reader endpoint) does (~1 s more)."""
    base = Path("/var/lib/eos-connectors") if os.geteuid() == 0 else Path.home() / ".cache"
    root = base / f"test-postgres-{uuid.uuid4().hex[:8]}"
    service = PostgresService(root, settings)
    try:
        service.save(service.start(None))
        if standby:
            service.stop()
            _signal_standby(service.data)
            service.save(service.start(service.load()))
        record = service.load()
        assert record is not None
        yield record.endpoint
    finally:
        service.stop()
        shutil.rmtree(root, ignore_errors=True)


def _signal_standby(data: Path) -> None:
    signal = data / "standby.signal"
    signal.touch()
    if os.geteuid() == 0:
        user = pwd.getpwnam(SERVER_OS_USER)
        os.chown(signal, user.pw_uid, user.pw_gid)
