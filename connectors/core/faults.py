"""Named fault points: no-ops unless a test enables one through the environment.

``EOS_FAULT_POINT`` holds comma-separated entries
``point[@batch][#partition][:query][=action]``:

* ``point`` is one of :data:`POINTS`;
* ``@N`` limits it to micro-batch N;
* ``#P`` limits it to the task of partition P (a task point only: the driver has none),
  so a test can crash one task of a batch after the others committed;
* ``:NAME`` limits it to the streaming query named NAME (``.queryName(NAME)``), so
  one pipeline of several queries crosses each query's points in a planned order
  (``after-prepare@3:kafka`` fires in the ``kafka`` query's batch 3 only);
* ``=action`` says what happens there: ``kill`` (the default), a scope to kill
  (``process``, ``group``, ``executor``), ``pause``, ``hold`` or ``restart``.

``kill`` sends SIGKILL, the way a crash would (no cleanup, no exception handler, no
``finally`` runs), to what ``EOS_FAULT_SCOPE`` names, or the entry's own scope:
``process`` (default: this process; in a task, Spark retries the task; in the
driver's commit, the query fails), ``group`` (the whole pipeline: the process group
in ``EOS_FAULT_PGID``, set by the pipeline, and this process's own group, PySpark's
worker daemon and workers) or ``executor`` (the executor JVM that runs this Python
worker, on a cluster; in local mode that is the driver, so the whole pipeline).

``pause`` makes a zombie: this Python worker ignores the signals its executor's
end would send it, kills its executor JVM (Spark re-runs the task elsewhere), then
waits until the file ``<marker dir>/<entry>.resume`` appears and goes on where it
stopped, long after its task was given up. The harness creates that file once the
batch is committed.

``hold`` stops the process at the point, killing nothing, until the same
``.resume`` file appears, then goes on into the next protocol step: meanwhile the
harness crashes a service (a step fault: the transaction coordinator between a Kafka
task's produce and its commit, PostgreSQL between the decision and its COMMIT
PREPAREDs), so that step meets the fault exactly.

``restart`` holds the task the same way while the pipeline that runs its query
(connectors/dev/harness/pipeline.py) stops that query and starts it again from its
checkpoint, in the same Spark session, as an operator restarting one query would: the
batch fails after the point and is replayed by the new start (Spark kills the held
process with its cancelled task; the pipeline creates the ``.resume`` file once the
query has stopped).

``EOS_FAULT_ROLE=driver|worker`` limits every entry to one kind of process.
``EOS_FAULT_MARKER=dir`` makes each entry fire once: a file named like the entry
is created in ``dir`` just before it fires, holding where it fired (JSON), and an
entry whose file exists stays quiet, so the restarted query runs on.

Tests that drive a sink without Spark use :func:`simulate` instead: an armed
point raises :class:`SimulatedCrash` in the calling process.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from eos_connectors.core.context import current_batch, current_partition, current_query_name

#: Every fault point, in protocol order. ``before-prepare`` is in a sink task after
#: it checked that its batch is undecided, before it writes anything; ``mid-prepare``
#: once the store has taken the task's first Arrow batch of rows.
POINTS = (
    "source-read",
    "before-prepare",
    "mid-prepare",
    "after-prepare",
    "after-decision",
    "between-commits",
    "after-commit",
)
SCOPES = ("process", "group", "executor")
ACTIONS = ("kill", *SCOPES, "pause", "hold", "restart")
WAITING = ("pause", "hold", "restart")  # actions that wait for a .resume file
PAUSE_LIMIT = 600.0  # a zombie nobody resumes gives up after ten minutes


class SimulatedCrash(BaseException):
    """Raised at an armed point inside :func:`simulate`: unwinds like a crash would."""


@dataclass(frozen=True)
class Entry:
    """One ``point[@batch][#partition][:query][=action]`` entry of ``EOS_FAULT_POINT``."""

    point: str
    batch: int | None = None
    query: str | None = None
    action: str = "kill"
    partition: int | None = None

    @classmethod
    def parse(cls, text: str) -> Entry:
        rest, _, action = text.strip().partition("=")
        rest, _, query = rest.partition(":")
        rest, _, partition = rest.partition("#")
        point, _, batch = rest.partition("@")
        if (
            point not in POINTS
            or (action and action not in ACTIONS)
            or (not batch.isdigit() and batch)
            or (not partition.isdigit() and partition)
        ):
            raise ValueError(
                f"EOS_FAULT_POINT entry {text!r}: expected point[@batch][#partition][:query]"
                f"[=action] with point one of {', '.join(POINTS)} and action one of "
                f"{', '.join(ACTIONS)}"
            )
        return cls(
            point,
            int(batch) if batch else None,
            query or None,
            action or "kill",
            int(partition) if partition else None,
        )

    def __str__(self) -> str:
        text = self.point + (f"@{self.batch}" if self.batch is not None else "")
        text += f"#{self.partition}" if self.partition is not None else ""
        text += f":{self.query}" if self.query else ""
        return text + (f"={self.action}" if self.action != "kill" else "")

    @property
    def scope(self) -> str:
        """What a kill takes down: the entry's own scope, else ``EOS_FAULT_SCOPE``."""
        if self.action in SCOPES:
            return self.action
        return os.environ.get("EOS_FAULT_SCOPE", "process")

    def matches(
        self, name: str, batch: int | None, query: str | None, partition: int | None = None
    ) -> bool:
        return (
            self.point == name
            and (self.batch is None or self.batch == batch)
            and (self.query is None or self.query == query)
            and (self.partition is None or self.partition == partition)
        )


_simulated: list[Entry] | None = None


def point(
    name: str, batch: int | None = None, role: str | None = None, query: str | None = None
) -> None:
    """Crash (or pause) here when an entry enables ``name`` for this batch, role and query.

    ``batch`` and ``query`` default to the running Spark task's.
    """
    if _simulated is not None:
        _simulated_point(name, batch, query)
        return
    entries = armed()
    if not entries:
        return
    wanted_role = os.environ.get("EOS_FAULT_ROLE")
    if wanted_role and role is not None and wanted_role != role:
        return
    batch = batch if batch is not None else current_batch()
    query = query if query is not None else current_query_name()
    partition = current_partition() if role != "driver" else None
    for entry in entries:
        if entry.matches(name, batch, query, partition) and _claim(
            entry, len(entries) > 1, role, batch, query
        ):
            if entry.action == "pause":
                _pause(entry)
            elif entry.action in WAITING:  # hold, restart
                _wait_for_resume(entry)
            else:
                _kill(entry.scope)
            return


def armed() -> list[Entry]:
    """The entries ``EOS_FAULT_POINT`` enables."""
    raw = os.environ.get("EOS_FAULT_POINT", "")
    return [Entry.parse(e) for e in raw.split(",") if e.strip()]


def schedule(
    points: list[str] | tuple[str, ...],
    times: int,
    first_batch: int = 1,
    query: str | None = None,
    action: str = "kill",
) -> list[str]:
    """Each point ``times`` times, one per batch from ``first_batch`` on, in ``query`` when
    given: ``["after-prepare@1:kafka", "after-commit@2:kafka", ...]``."""
    entries = [p for _ in range(times) for p in points]
    return [str(Entry(p, first_batch + i, query, action)) for i, p in enumerate(entries)]


def fired(markers: Path) -> dict[str, dict[str, object]]:
    """Entry -> where it fired (pid, role, batch, query), read from a marker directory."""
    if not markers.is_dir():
        return {}
    found: dict[str, dict[str, object]] = {}
    for path in markers.iterdir():
        if path.suffix in (".resume", ".resumed"):
            continue
        try:
            found[path.name] = json.loads(path.read_text() or "{}")
        except ValueError:  # written by an older version: a bare pid
            found[path.name] = {}
    return found


@contextlib.contextmanager
def simulate(*entries: str) -> Iterator[None]:
    """Within the block, an armed point raises :class:`SimulatedCrash` (each entry once)."""
    global _simulated
    previous = _simulated
    _simulated = [Entry.parse(e) for e in entries]
    try:
        yield
    finally:
        _simulated = previous


def _simulated_point(name: str, batch: int | None, query: str | None) -> None:
    assert _simulated is not None
    for entry in list(_simulated):
        if entry.matches(name, batch, query, current_partition()):
            _simulated.remove(entry)
            raise SimulatedCrash(str(entry))


def _claim(
    entry: Entry, listed: bool, role: str | None, batch: int | None, query: str | None
) -> bool:
    """Create the entry's marker (once); False when it exists (the entry fired already)."""
    marker = os.environ.get("EOS_FAULT_MARKER")
    if not marker:
        return True
    path = Path(marker)
    if listed or entry.action in WAITING:
        path.mkdir(parents=True, exist_ok=True)
        path = path / str(entry)
    where = {"pid": os.getpid(), "role": role, "batch": batch, "query": query, "at": time.time()}
    try:
        with open(path, "x") as handle:
            handle.write(json.dumps(where))
    except FileExistsError:
        return False
    return True


def _kill(scope: str) -> None:
    if scope == "group":
        # PySpark's worker daemon runs in a process group of its own: kill the query's
        # group (named by the pipeline in EOS_FAULT_PGID), then the daemon's.
        query_group = int(os.environ.get("EOS_FAULT_PGID") or os.getpgid(0))
        os.killpg(query_group, signal.SIGKILL)
        os.killpg(os.getpgid(0), signal.SIGKILL)
    elif scope == "executor":
        jvm = executor_jvm()
        if jvm is not None:
            os.kill(jvm, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def executor_jvm(pid: int | None = None) -> int | None:
    """The nearest ``java`` process above ``pid`` (this process): the JVM whose Python
    worker this is (the executor on a cluster, the driver in local mode)."""
    import psutil

    try:
        process = psutil.Process(os.getppid() if pid is None else pid)
        while process.pid > 1:
            if Path(process.exe()).name == "java":
                return int(process.pid)
            parent = process.parent()
            if parent is None:
                return None
            process = parent
    except psutil.Error:
        return None
    return None


def _pause(entry: Entry) -> None:
    """Outlive this worker's executor: ignore its shutdown signals, kill it, wait for the
    harness to resume this process, then return into the task's code."""
    for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    jvm = executor_jvm()
    if jvm is not None:
        os.kill(jvm, signal.SIGKILL)
    _wait_for_resume(entry)


def _wait_for_resume(entry: Entry) -> None:
    """Wait (at most PAUSE_LIMIT) until the harness creates ``<entry>.resume``."""
    if not os.environ.get("EOS_FAULT_MARKER"):
        return  # no marker directory: nobody could resume us, so go on at once
    marker = Path(os.environ["EOS_FAULT_MARKER"])
    resume = marker / f"{entry}.resume"
    deadline = time.monotonic() + PAUSE_LIMIT
    while not resume.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    (marker / f"{entry}.resumed").write_text(json.dumps({"pid": os.getpid(), "at": time.time()}))
