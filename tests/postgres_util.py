"""Throw-away PostgreSQL servers for tests that need one configured differently from the
stack's: a cluster of their own, under a directory the server's OS user can reach."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import uuid
from collections.abc import Generator
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict

from eos_connectors.dev.stack.postgres import SERVER_OS_USER, PostgresService
from eos_connectors.dev.stack.process import free_port, wait_until


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


def pgbouncer(dsn: str, pool_mode: str) -> Generator[str, None, None]:
    """The DSN of a PgBouncer on a free loopback port in front of the server of ``dsn``,
    pooling in ``pool_mode``; stopped afterwards. Its config, which holds the server's
    password, is readable by its owner only."""
    binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    assert Path(binary).exists(), "pgbouncer is not installed (scripts/bootstrap.sh does)"
    server = conninfo_to_dict(dsn)
    base = Path("/var/lib/eos-connectors") if os.geteuid() == 0 else Path.home() / ".cache"
    root = base / f"test-pgbouncer-{uuid.uuid4().hex[:8]}"
    root.mkdir(parents=True)
    port = free_port()
    backend = " ".join(f"{k}={server[k]}" for k in ("host", "port", "dbname", "user", "password"))
    config = root / "pgbouncer.ini"
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(
            f"[databases]\n{server['dbname']} = {backend}\n[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {root}/users.txt\npool_mode = {pool_mode}\n"
        )
    (root / "users.txt").write_text(f'"{server["user"]}" ""\n')
    argv = [binary, str(config)]
    if os.geteuid() == 0:  # PgBouncer refuses to run as root
        user = pwd.getpwnam(SERVER_OS_USER)
        for path in (root, config, root / "users.txt"):
            os.chown(path, user.pw_uid, user.pw_gid)
        argv = ["runuser", "-u", SERVER_OS_USER, "--", *argv]
    proc = subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    pooled = f"postgresql://{server['user']}@127.0.0.1:{port}/{server['dbname']}"
    try:
        wait_until(lambda: _answers(pooled), timeout=20, what="PgBouncer")
        yield pooled
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # a throw-away pooler: runuser and it, at once
        proc.wait(timeout=20)
        shutil.rmtree(root, ignore_errors=True)


def _answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True
