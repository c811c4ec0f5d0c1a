"""Throw-away Redis servers for tests that need one configured differently from the stack's."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Generator
from pathlib import Path

import redis

from eos_connectors.dev.stack.process import free_port


def redis_server(
    tmp_path: Path, *settings: str, password: str = ""
) -> Generator[redis.Redis, None, None]:
    """A redis-server on a free loopback port, stopped afterwards.

    ``password`` goes in a config file only its owner can read, never on the command line.
    """
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed (scripts/bootstrap.sh installs it)"
    port = free_port()
    config = tmp_path / "redis.conf"
    fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(f"requirepass {password}\n" if password else "")
    proc = subprocess.Popen(
        [
            binary,
            str(config),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--dir",
            str(tmp_path),
            "--save",
            "",
            *settings,
        ],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port, password=password or None)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None, f"redis-server {settings} exited: {proc.returncode}"
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.1)
        yield client
    finally:
        client.close()
        proc.kill()
        proc.wait()
