"""Stopping a frozen server: ``terminate`` (``eos stack down``) stops a server and its
workers left stopped by SIGSTOP (a frozen-store test killed before it thawed them) at
once, and leaves no worker stopped. Cost: ~0.2 s."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from eos_connectors.dev.stack.process import pid_alive, terminate

#: A server with one worker that, like PostgreSQL's postmaster, ends its worker on SIGTERM
#: (and notes that it did, in argv[2]). It notes its worker's pid (argv[1]) only once its
#: handler is in place: the test's SIGTERM follows that note at once, and on a busy
#: machine it once came first and killed the server (a CI run: "killed after 0.0 s").
SERVER = """
import signal, subprocess, sys
worker = subprocess.Popen(["sleep", "60"])
def stop(*_):
    worker.terminate(); worker.wait(); open(sys.argv[2], "w").write("stopped"); sys.exit(0)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[1], "w").write(str(worker.pid))
signal.pause()
"""


def test_a_frozen_server_and_its_worker_stop_at_once(tmp_path: Path) -> None:
    noted, clean = tmp_path / "worker", tmp_path / "clean"
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(noted), str(clean)], start_new_session=True
    )
    worker = 0
    try:
        deadline = time.monotonic() + 30
        while not (noted.exists() and noted.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        worker = int(noted.read_text())
        os.killpg(server.pid, signal.SIGSTOP)  # the server and its worker, as frozen() does
        began = time.monotonic()
        terminate(server.pid, timeout=20)
        took = time.monotonic() - began
        assert clean.exists(), f"the server did not act on SIGTERM: killed after {took:.1f} s"
        assert took < 10, f"stopping the frozen server took {took:.1f} s"
        deadline = time.monotonic() + 10
        while pid_alive(worker) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not pid_alive(worker), "the server's worker outlived it"
    finally:
        for pid in (server.pid, worker):
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)  # ends a stopped process too
