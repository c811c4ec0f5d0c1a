"""The stack's crash of a service kills the server and every worker it has, those it forks
while it is being killed included: a PostgreSQL backend that outlived its postmaster
would end its transaction in order, which no machine crash does (docs/postgres-sink.md,
"Stages"). Cost: ~1 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from eos_connectors.dev.stack.process import crash, pid_alive

#: A server that forks a worker every millisecond or so, and notes each one's pid.
FORKER = """
import subprocess, sys
with open(sys.argv[1], "a", buffering=1) as out:
    while True:
        out.write(f"{subprocess.Popen(['sleep', '60']).pid}\\n")
"""


def _forked(pids: Path) -> list[int]:
    return [int(line) for line in pids.read_text().split()] if pids.exists() else []


def test_a_crash_leaves_no_worker_the_server_forked_while_it_was_killed(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    server = subprocess.Popen([sys.executable, "-c", FORKER, str(pids)], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(_forked(pids)) < 50 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(_forked(pids)) >= 50, "the forking server did not start"
        crash(server.pid)
        server.wait(timeout=10)
        survivors = [pid for pid in _forked(pids) if pid_alive(pid)]
        assert not survivors, f"{len(survivors)} worker(s) outlived the crash"
    finally:
        server.kill()
        for pid in _forked(pids):
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
