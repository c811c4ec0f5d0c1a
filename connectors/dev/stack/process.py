"""Process helpers shared by the stack's services: ports, spawning, waiting, stopping."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from eos_connectors.core.errors import StackError

LOOPBACK = "127.0.0.1"


#: How long a restart waits for its old port: connections a crashed server left in
#: FIN_WAIT2 hold it for up to net.ipv4.tcp_fin_timeout (60 s by default).
PORT_WAIT = 65.0


def free_port(preferred: int | None = None, wait: float = PORT_WAIT) -> int:
    """Return ``preferred`` once it is free on loopback (waiting up to ``wait`` seconds:
    clients keep the endpoint they know), else a new free port (:func:`_new_port`)."""
    deadline = time.monotonic() + wait
    while preferred:
        if port_is_free(preferred):
            return preferred
        if time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    return _new_port()


#: Where each new port is reserved for a while, across processes: a server binds its
#: port seconds after it was chosen (a broker's JVM starts first), and stacks start
#: side by side (scripts/test.sh starts two at once, then HDFS and a Spark cluster).
RESERVED = Path(tempfile.gettempdir()) / f"eos-connectors-ports-{os.getuid()}"
#: Seconds a reservation holds: long enough for any server here to bind.
RESERVED_FOR = 180.0
#: New ports come from below the kernel's ephemeral range, which the OS hands to every
#: outgoing connection: a port it picked, free when checked, was once taken by one (a
#: pip download beside the stack's start) before the broker bound it, and the broker
#: exited with "Address already in use".
LISTEN_FLOOR = 20_000


def _new_port() -> int:
    """A port free now, not in the ephemeral range, and not handed out in the last
    ``RESERVED_FOR`` seconds by this function in any process; one the OS picks where the
    ephemeral range leaves no room below it."""
    ceiling = _ephemeral_floor()
    if ceiling - LISTEN_FLOOR >= 1_000:
        RESERVED.mkdir(exist_ok=True)
        _forget_stale()
        for _ in range(200):
            port = random.randrange(LISTEN_FLOOR, ceiling)
            if port_is_free(port) and _reserve(port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def _ephemeral_floor() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default


def _forget_stale() -> None:
    """Remove the claims older than ``RESERVED_FOR`` seconds."""
    now = time.time()
    for mark in RESERVED.iterdir():
        with contextlib.suppress(OSError):
            if now - mark.stat().st_mtime > RESERVED_FOR:
                mark.unlink()


def _reserve(port: int) -> bool:
    """Claim ``port``: a file created exclusively (no other process holds a claim)."""
    mark = RESERVED / str(port)
    try:
        os.close(os.open(mark, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False
    return True


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    return _state(pid) == "Z"


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children, ...), from /proc."""
    parents: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def pid_cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def owned_pid(pid: int | None, marker: Path) -> bool:
    """True when ``pid`` runs and its command line names ``marker`` (a file of this stack).

    This is how ``down`` stops only what the stack started: a recycled pid of
    some other program never names the stack's own config file.
    """
    return bool(pid) and pid_alive(int(pid or 0)) and str(marker) in pid_cmdline(int(pid or 0))


def spawn(
    argv: Sequence[str], log_path: Path, cwd: Path, env: Mapping[str, str] | None = None
) -> int:
    """Start a detached server process (own session, output to ``log_path``, ``env`` or
    this process's environment); return its pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=None if env is None else dict(env),
        )
    return proc.pid


def terminate(pid: int, timeout: float = 30.0, sig: int = signal.SIGTERM) -> None:
    """Send ``sig`` (SIGTERM), wait up to ``timeout`` seconds, then SIGKILL.

    ``pid`` and every process below it are continued (SIGCONT) once ``sig`` is sent: a
    server left frozen (SIGSTOP, as ``Stack.frozen`` does, by a test whose process was
    killed before it could thaw it) acts on ``sig`` at once instead of being killed at
    the timeout, and no worker of it stays stopped after it (PostgreSQL's backends
    did, orphaned)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return
    for each in (pid, *descendants(pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGCONT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            _reap(pid)
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _reap(pid)


def crash(pid: int, timeout: float = 30.0) -> None:
    """SIGKILL ``pid`` and its children (a server's workers) at once, as a machine crash
    would stop them, and wait until all are gone so the server can start again.

    ``pid`` is stopped before its children are listed, so no child it forks in between
    outlives it: a PostgreSQL backend that did would end its transaction in order after
    its postmaster died, which no crash does (docs/postgres-sink.md, "Stages")."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGSTOP)
    _wait_stopped(pid, timeout)
    victims = [pid, *children(pid)]
    for victim in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    for victim in victims:
        _reap(victim)
        while pid_alive(victim) and time.monotonic() < deadline:
            time.sleep(0.05)
            _reap(victim)


def _wait_stopped(pid: int, timeout: float) -> None:
    """Until ``pid`` is stopped or gone: a signal is delivered after ``kill`` returns."""
    deadline = time.monotonic() + timeout
    while _state(pid) not in ("T", "Z", "") and time.monotonic() < deadline:
        time.sleep(0.001)


def _state(pid: int) -> str:
    """``pid``'s state letter from /proc (``T`` stopped, ``Z`` zombie), ``""`` if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[0]


def children(pid: int) -> list[int]:
    """Pids whose parent is ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(int(stat.parent.name))
    return found


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def wait_until(
    check: Callable[[], bool],
    timeout: float,
    what: str,
    alive: Callable[[], bool] = lambda: True,
    log_path: Path | None = None,
) -> None:
    """Poll ``check`` until true; fail with the log's tail on timeout or when the process dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if not alive():
            raise StackError(f"{what}: the process exited while starting.{log_tail(log_path)}")
        time.sleep(0.25)
    raise StackError(f"{what}: not ready after {timeout:.0f} s.{log_tail(log_path)}")


def log_tail(log_path: Path | None, lines: int = 25) -> str:
    if log_path is None or not log_path.exists():
        return ""
    tail = log_path.read_text(errors="replace").splitlines()[-lines:]
    return f"\nLast lines of {log_path}:\n" + "\n".join(tail)


def require_binary(name: str, install_hint: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise StackError(f"'{name}' was not found on PATH. {install_hint}")
    return path


def run(
    argv: Sequence[str],
    what: str,
    cwd: Path | None = None,
    timeout: float = 600,
    stdin: str | None = None,
    env: Mapping[str, str] | None = None,
) -> str:
    """Run a command to completion (in ``env``, else this process's environment); a
    non-zero exit is a StackError carrying its output."""
    try:
        done = subprocess.run(
            list(argv),
            cwd=cwd,
            env=None if env is None else dict(env),
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"{what}: timed out after {timeout:.0f} s") from exc
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip().splitlines()[-30:]
        raise StackError(f"{what} failed (exit {done.returncode}):\n" + "\n".join(output))
    return done.stdout
