"""`eos stack`: idempotent up, down stops only what it started, restart keeps the port.

Second tier (`make full`, ~13 s): run it before a release and whenever
connectors/dev/stack changes (every CI run starts and stops the stack anyway).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from eos_connectors.dev.stack import Stack
from eos_connectors.dev.stack.process import pid_alive

pytestmark = [pytest.mark.services, pytest.mark.full]


def _eos(*args: str, root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EOS_STACK_DIR": str(root)}
    return subprocess.run(
        [sys.executable, "-m", "eos_connectors.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.mark.cost(13)
def test_stack_up_twice_down_once(tmp_path_factory: pytest.TempPathFactory) -> None:
    # A separate root so this test's stack is its own, beside the session's.
    base = Path("/var/lib/eos-connectors") if os.geteuid() == 0 else tmp_path_factory.mktemp("s")
    root = base / f"test-stack-{os.getpid()}"
    try:
        first = _eos("stack", "up", root=root)
        assert first.returncode == 0, first.stderr
        pids = {s.name: s.pid for s in Stack(root).status()}
        assert all(pids.values()), pids

        second = _eos("stack", "up", root=root)
        assert second.returncode == 0, second.stderr
        assert {s.name: s.pid for s in Stack(root).status()} == pids  # reused, not restarted

        env = _eos("stack", "env", root=root)
        assert "EOS_KAFKA_BOOTSTRAP=" in env.stdout and "EOS_REDIS_URL=" in env.stdout

        redis_port = Stack(root).services["redis"].load().ports  # type: ignore[union-attr]
        Stack(root).restart("redis")
        assert Stack(root).services["redis"].load().ports == redis_port  # type: ignore[union-attr]
        # A crash (SIGKILL of the server and its workers) leaves lock files naming dead
        # or zombie pids; `up` must start the server again on its port all the same.
        for name in ("postgres", "redis"):
            Stack(root).kill(name)
            assert not Stack(root).is_up()
            Stack(root).up()
        with psycopg.connect(Stack(root).endpoints().postgres_dsn) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
        pids = {s.name: s.pid for s in Stack(root).status()}

        down = _eos("stack", "down", root=root)
        assert down.returncode == 0, down.stderr
        assert not any(pid_alive(pid) for pid in pids.values() if pid)
        status = _eos("stack", "status", root=root)
        assert status.returncode == 3
        assert "running" not in status.stdout
    finally:
        Stack(root).down()
        subprocess.run(["rm", "-rf", str(root)], check=False)


def test_down_leaves_foreign_processes_alone(tmp_path: Path) -> None:
    # A record pointing at a process the stack did not start (this test's sleep) is ignored.
    stack = Stack(tmp_path)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        service = stack.services["redis"]
        service.dir.mkdir(parents=True)
        service.record_path.write_text(
            f'{{"name": "redis", "pid": {sleeper.pid}, "ports": [1], "endpoint": "redis://x"}}'
        )
        assert stack.down() == []
        assert sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
