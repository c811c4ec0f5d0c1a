"""A sink's start checks, once per Spark driver rather than at every batch.

Spark calls a Python sink's ``streamWriter`` in a new Python process of the driver for
the query's start, again for each batch's writer factory and again for each batch's
commit (``pyspark.sql.worker.python_streaming_sink_runner``). The checks against the
service (reachable, configured as the guarantee needs, table and bookkeeping in place,
orphans to warn about) belong to the query's start: run at every call, they cost each
batch a connection and a scan, and repeat the orphan warning twice a batch.

:func:`once_per_driver` runs them in the first call of a driver and records that they
passed in a marker named by the driver's JVM (its pid and start time) and the sink's
settings; :func:`per_driver` keeps a short answer the same way (what a broker allows).
The driver's JVM is the process's parent, or its grandparent when the parent is the
Python daemon Spark forked the process from (Spark 4.3 forks every planner process,
the write's and the commit's, from a daemon of its own): the commit's first call then
finds what the write's recorded, instead of checking again on batch 0's way to its
commit (the Kafka sink's: 232-241 ms, now 43-44; docs/bench.md). A failed check records
nothing, so the next call checks again. A driver that records its first marker
deletes those of drivers that have ended. A sink that starts on a checkpoint after
another sink did there under the same driver is a new start (:func:`tenure`), whose checks
run again. Outside a Python process started by Spark (a test, a script) the checks always
run.

"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from eos_connectors.core.checkpoint_sinks import checkpoint_location

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)


#: Set by Spark in the Python processes it starts (PythonWorkerFactory). Over TCP: the
#: secret in every one, the port only in those it starts directly; processes forked
#: from its daemon (``pyspark.daemon``), as the sink's commit runners are in Spark 4.3,
#: have the secret alone, and their parent is the daemon. Over Unix domain sockets
#: (``spark.python.unix.domain.socket.enabled``) there is no secret: every one has the
#: flag and the socket directory, the socket path only those started directly.
SPARK_WORKER_ENV = (
    "PYTHON_WORKER_FACTORY_SECRET",
    "PYTHON_WORKER_FACTORY_PORT",
    "PYTHON_WORKER_FACTORY_SOCK_PATH",
    "PYTHON_UNIX_DOMAIN_ENABLED",
    "PYTHON_WORKER_FACTORY_SOCK_DIR",
)


def once_per_driver(key: str, check: Callable[[], None]) -> None:
    """Driver: run ``check`` unless it passed before for ``key`` under this driver.

    Markers live in a directory of the user's own (``eos-start-checks-<uid>``, mode 0700,
    under the system's temporary directory): a second OS user's driver never meets the
    first one's. A marker that cannot be written (a directory the user cannot write)
    only means the checks run again at the next call."""

    def checked() -> str:
        check()
        return ""

    per_driver(key, checked)


def per_driver(key: str, compute: Callable[[], str]) -> str:
    """Driver: ``compute()``'s answer for ``key``, computed once under this driver and kept
    in its marker, where the driver's later processes read it (no secret belongs in it: a
    marker is a file, if in a directory of the user's own). ``compute`` raising records
    nothing."""
    marker = _marker(key)
    if marker is not None:
        with contextlib.suppress(OSError):
            return marker.read_text()
    answer = compute()
    if marker is not None:
        try:
            marker.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            forget_ended_drivers(marker.parent)
            _write_atomically(marker, answer)
        except OSError as exc:
            log.info("a start answer goes unrecorded (%s): it is asked again next time", exc)
    return answer


def _write_atomically(path: Path, text: str) -> None:
    """A reader finds the whole answer or no marker (a driver's processes may call at once)."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".writing-")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        Path(temporary).replace(path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def forget_ended_drivers(directory: Path) -> int:
    """Delete the markers in ``directory`` whose driver (pid and start time) is gone;
    how many. Another driver's marker may vanish under us: that is fine."""
    forgotten = 0
    for marker in directory.glob("*-*-*"):
        pid, started, _ = marker.name.split("-", 2)
        if pid.isdigit() and _process_identity(int(pid)) != f"{pid}-{started}":
            marker.unlink(missing_ok=True)
            forgotten += 1
    return forgotten


def start_key(source: str, options: Mapping[str, str], schema: StructType) -> str:
    """What makes two sinks' start checks the same: the format, options and schema, and
    the sink's tenure on its checkpoint under this driver (:func:`tenure`). Only a digest
    of it is ever written."""
    sink = "|".join((repr(sorted(options.items())), schema.json()))
    return "|".join((source, sink, tenure(checkpoint_location(options), sink)))


def tenure(checkpoint: str | None, sink: str) -> str:
    """Driver: which of this driver's starts on ``checkpoint`` the ``sink`` (its options and
    schema) is in: the count moves on whenever the sink that calls is not the one that
    called last. So a sink that starts on a checkpoint after another one did there (a
    notebook switching a query's sink id, or its bookkeeping names, back and forth) is a
    new start, whose checks run again, as a new driver's would: a switch mid-batch is
    refused however often the options were used before (``core.sink_switch``). A query's
    processes call in turn, never beside another query on the same checkpoint. Empty
    without a checkpoint or outside a process Spark started (where markers are not kept)."""
    marker = None if checkpoint is None else _marker(f"checkpoint|{_same_place(checkpoint)}")
    if marker is None:
        return ""
    ours = hashlib.sha256(sink.encode()).hexdigest()[:24]
    try:
        holder, _, count = marker.read_text().partition(" ")
    except OSError:
        holder, count = "", ""
    if holder == ours:
        return count
    moved = str(int(count) + 1 if count.isdigit() else 1)
    try:
        marker.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _write_atomically(marker, f"{ours} {moved}")
    except OSError as exc:
        log.info("a sink's start on %s goes unrecorded (%s)", checkpoint, exc)
    return moved


def _same_place(checkpoint: str) -> str:
    """``checkpoint`` written one way for every way of naming a local directory (a path,
    relative or not, or a ``file:`` URI), so that two starts name one checkpoint alike."""
    parsed = urlparse(checkpoint)
    if parsed.scheme in ("", "file"):
        return "file:" + os.path.realpath(parsed.path if parsed.scheme else checkpoint)
    return checkpoint


def started_by_spark() -> bool:
    """Whether this is a Python process Spark started (a worker, a planner, a commit)."""
    return any(name in os.environ for name in SPARK_WORKER_ENV)


def _marker(key: str) -> Path | None:
    if not started_by_spark():
        return None
    driver = _driver_identity()
    if driver is None:
        return None
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    folder = f"eos-start-checks-{os.getuid()}"
    return Path(tempfile.gettempdir()) / folder / f"{driver}-{digest}"


def _driver_identity() -> str | None:
    """The driver JVM's identity (:func:`_process_identity`): this process's parent, or
    the parent's parent when the parent runs this process's Python (a daemon it was forked
    from: a JVM never does)."""
    import psutil

    try:
        parent = psutil.Process(os.getppid())
        if parent.exe() == psutil.Process().exe():
            return _process_identity(parent.ppid())
    except psutil.Error:
        return None
    return _process_identity(parent.pid)


def _process_identity(pid: int) -> str | None:
    """``pid`` plus its start time in hundredths of a second (a reused pid is another
    process); None when there is no such process."""
    import psutil

    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        return None
    return f"{pid}-{round(started * 100)}"
