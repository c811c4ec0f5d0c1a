"""One pipeline as an OS process: its ``EOS-EVENT`` lines, its memory and CPU time (and
the local broker's), its SIGKILL."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import statistics
import subprocess
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from eos_connectors.dev.harness.pipeline import parse_event

SAMPLE_SECONDS = 0.25
PSS_EVERY = 4  # one PSS reading a second


#: Each process of a pipeline's tree is in exactly one part (:func:`part_of`).
PARTS = ("jvm", "driver", "tasks", "planners")
#: The report's "Python workers": every Python process but the driver (older reports
#: kept them as one part, ``workers``).
WORKERS = ("tasks", "planners")
#: What Spark's driver-side Python processes run, as their command line names it (a
#: worker forked from a daemon keeps the daemon's): a data source's look-up, creation
#: and read and write planning, the streaming source and sink runners, a stateful
#: stage's driver side.
PLANNER_MODULES = ("pyspark.sql.worker.", "pyspark.sql.streaming.")


@dataclass
class Memory:
    """Peak memory (MB) of a pipeline's parts: ``jvm`` (Spark's JVM), ``driver`` (the
    launched Python process), ``tasks`` (the Python workers that run tasks, and their
    daemon) and ``planners`` (Spark's driver-side Python processes:
    :data:`PLANNER_MODULES`), each as resident set (RSS) and as proportional set (PSS:
    a page that n processes share counts 1/n in each). Spark forks its Python workers
    from a daemon, so they share much of their memory: their RSS adds the shared pages
    once per worker, their PSS once in all. PSS is read from
    ``/proc/PID/smaps_rollup``, every :data:`PSS_EVERY` th sample (it walks the page
    tables: cheap, not free). Each part's peak is its own: the whole pipeline's figure
    is the sum of the parts' peaks, an upper bound of its peak."""

    rss_mb: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    pss_mb: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    _samples: int = 0

    def sample(self, root: psutil.Process, tree: list[psutil.Process]) -> None:
        with_pss = self._samples % PSS_EVERY == 0
        self._samples += 1
        rss = dict.fromkeys(PARTS, 0)
        pss = dict.fromkeys(PARTS, 0)
        for proc in tree:
            try:
                part = part_of(root, proc)
                rss[part] += proc.memory_info().rss
                if with_pss:
                    pss[part] += proc.memory_full_info().pss
            except (psutil.Error, AttributeError):  # gone, or no PSS on this system
                continue
        for part in PARTS:
            self.rss_mb[part] = max(self.rss_mb[part], rss[part] / 2**20)
            self.pss_mb[part] = max(self.pss_mb[part], pss[part] / 2**20)


def part_of(root: psutil.Process, proc: psutil.Process) -> str:
    """The part of the pipeline ``proc`` belongs to (:data:`PARTS`); ``root`` is the
    launched driver process."""
    if proc.pid == root.pid:
        return "driver"
    if proc.name() == "java":
        return "jvm"
    command = " ".join(proc.cmdline())
    return "planners" if any(m in command for m in PLANNER_MODULES) else "tasks"


def total(parts: dict[str, float]) -> float:
    """A pipeline's whole memory from its parts' figures, each process once (an older
    report's ``workers`` is the sum of ``tasks`` and ``planners``)."""
    return sum(parts.get(p, 0.0) for p in (*PARTS, "workers"))


def workers(parts: dict[str, float]) -> float:
    """The Python workers' figure (every Python process but the driver)."""
    return parts.get("workers", 0.0) + sum(parts.get(p, 0.0) for p in WORKERS)


#: The JVM's own threads whose CPU the clock counts apart, by how their names begin
#: (``/proc/PID/task/TID/comm``, cut to 15 characters): HotSpot's garbage collection
#: (with the VM thread, which runs its pauses) and its JIT compilers.
JVM_THREADS = {
    "jvm-gc": ("GC Thread", "G1 ", "VM Thread"),
    "jvm-jit": ("C1 CompilerThre", "C2 CompilerThre"),
}
#: Every how many samples the JVM's threads are listed again (G1 starts GC threads as
#: it needs them); in between only the known ones' CPU is read.
THREAD_LIST_EVERY = 4


@dataclass
class CpuClock:
    """CPU seconds (user and system) used so far by the pipeline (every process of its
    tree, the JVM and Python workers included; a process that exited keeps what it
    used), by each of its parts (:data:`PARTS`, and the JVM's garbage collection and
    JIT threads: :data:`JVM_THREADS`) and by the Kafka broker when it runs on this
    machine, sampled over time and read between two moments (a phase's first and last
    batch): what a pipeline costs the machine per record, the broker's share included,
    which transactions raise, and where in the pipeline it goes. A JVM thread found at
    a listing counts from that sample on with all it used before (a GC thread G1 starts
    mid-phase moves its first CPU to that sample)."""

    broker: psutil.Process | None = None
    #: (wall clock, CPU s so far by "pipeline", each part, "jvm-gc", "jvm-jit", "broker")
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    _used: dict[tuple[int, float], tuple[str, float]] = field(default_factory=dict)
    _threads: dict[str, float] = field(default_factory=dict)  # /proc stat path -> CPU s
    _kinds: dict[str, str] = field(default_factory=dict)  # same path -> its kind
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def sample(self, tree: list[psutil.Process]) -> None:
        """Sampler thread, and the kill (a last sample, so the phase's end is covered).
        ``tree``: the launched process first, then its descendants."""
        with self._lock:
            for proc in tree:
                with contextlib.suppress(psutil.Error):  # gone: it keeps its last sample
                    # Asked every time: Spark's launcher script becomes the JVM (exec).
                    part = part_of(tree[0], proc)
                    self._used[(proc.pid, proc.create_time())] = (part, _busy(proc))
                    if part == "jvm":
                        self._jvm_threads(proc.pid, len(self.samples))
            used = dict.fromkeys((*PARTS, *JVM_THREADS), 0.0)
            for part, seconds in self._used.values():
                used[part] += seconds
            for path, seconds in self._threads.items():
                used[self._kinds[path]] += seconds
            used["pipeline"] = sum(used[p] for p in PARTS)
            used["broker"] = cpu_seconds(self.broker)
            self.samples.append((time.time(), used))

    def _jvm_threads(self, pid: int, count: int) -> None:
        """The CPU so far of the JVM's GC and JIT threads (listed again every
        :data:`THREAD_LIST_EVERY` samples)."""
        if count % THREAD_LIST_EVERY == 0:
            for task in _listed(Path(f"/proc/{pid}/task")):
                path = str(task / "stat")
                kind = _thread_kind(_read(str(task / "comm")))
                if kind is not None and path not in self._kinds:
                    self._kinds[path] = kind
        for path in self._kinds:
            if path.startswith(f"/proc/{pid}/"):
                seconds = _thread_cpu(_read(path))
                if seconds is not None:  # an exited thread keeps its last reading
                    self._threads[path] = seconds

    def between(self, start: float, end: float) -> dict[str, float] | None:
        """CPU seconds from ``start`` to ``end`` (``time.time()``), interpolated between
        samples: ``pipeline``, each of :data:`PARTS`, ``jvm-gc`` and ``jvm-jit`` (part of
        ``jvm``), and ``broker`` when it is on this machine; None when the samples do not
        span the interval."""
        if len(self.samples) < 2 or not self.samples[0][0] <= start < end <= self.samples[-1][0]:
            return None
        first, last = self._at(start), self._at(end)
        used = {who: last[who] - first[who] for who in first}
        if self.broker is None:
            del used["broker"]
        return used

    def _at(self, moment: float) -> dict[str, float]:
        i = max(1, bisect_left(self.samples, moment, key=lambda s: s[0]))
        (t0, before), (t1, after) = self.samples[i - 1], self.samples[i]
        share = (moment - t0) / (t1 - t0) if t1 > t0 else 1.0
        return {who: before[who] + (after[who] - before[who]) * share for who in before}


def _thread_kind(name: str | None) -> str | None:
    """The :data:`JVM_THREADS` kind of a thread named ``name``, None for any other."""
    if name is None:
        return None
    return next((k for k, starts in JVM_THREADS.items() if name.startswith(starts)), None)


def _thread_cpu(stat: str | None) -> float | None:
    """User and system CPU seconds in a ``/proc/.../stat`` line (fields 14 and 15, after
    the name in parentheses, which may hold spaces)."""
    if stat is None:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _read(path: str) -> str | None:
    try:
        with open(path) as file:
            return file.read().strip()
    except OSError:  # the thread or process is gone
        return None


def _listed(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:  # the process is gone
        return []


#: Every how many samples the machine's speed is probed (one probe a second).
PROBE_EVERY = 4
_PROBE_DATA = bytes(range(256)) * 256  # 64 KiB


@dataclass
class SpeedProbe:
    """How fast the machine runs a fixed piece of work now: the CPU milliseconds (this
    thread's) that a Python loop and some SHA-256 take (1.4-2.8 ms on a 2-core EPYC).
    Two runs of one pipeline can take a third more CPU a record in one minute than in
    another, in every part alike (docs/bench.md); the probe beside each round shows
    when the machine, not the code, was slow. It costs ~0.2% of one core."""

    #: (wall clock, CPU ms the piece took)
    samples: list[tuple[float, float]] = field(default_factory=list)

    def sample(self) -> None:
        began = time.thread_time()
        total = 0
        for i in range(20_000):
            total += i * i % 7
        for _ in range(20):
            hashlib.sha256(_PROBE_DATA).digest()
        self.samples.append((time.time(), (time.thread_time() - began) * 1000))

    def median_between(self, start: float, end: float) -> float | None:
        """The median probe from ``start`` to ``end``, None when none ran then."""
        taken = [ms for at, ms in self.samples if start <= at <= end]
        return statistics.median(taken) if taken else None


def cpu_seconds(proc: psutil.Process | None) -> float:
    """``proc``'s user and system CPU seconds so far; 0 for None or a process gone."""
    if proc is None:
        return 0.0
    try:
        return _busy(proc)
    except psutil.Error:
        return 0.0


def _busy(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def local_broker(bootstrap: str) -> psutil.Process | None:
    """The process listening on the first bootstrap server's port, when that server is
    on this machine's loopback (the local stack's broker); else None."""
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    if host.strip("[]") not in ("127.0.0.1", "localhost", "::1") or not port.isdigit():
        return None
    try:
        listening = psutil.net_connections(kind="tcp")
    except psutil.Error:
        return None
    for conn in listening:
        address = conn.laddr
        listens = conn.status == psutil.CONN_LISTEN and getattr(address, "port", None) == int(port)
        if listens and conn.pid:
            with contextlib.suppress(psutil.Error):
                return psutil.Process(conn.pid)
    return None


@dataclass
class PipelineProcess:
    """Started in its own session, so a SIGKILL of its group takes the JVM and workers too."""

    command: list[str]
    log: Path
    env: dict[str, str]
    events: list[dict[str, Any]] = field(default_factory=list)
    memory: Memory = field(default_factory=Memory)
    cpu: CpuClock = field(default_factory=CpuClock)
    speed: SpeedProbe = field(default_factory=SpeedProbe)

    def start(self) -> PipelineProcess:
        self._stderr = self.log.open("ab")
        self.started_at = time.time()
        self.proc = subprocess.Popen(
            self.command,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, **self.env},
            start_new_session=True,
            text=True,
        )
        self._root = psutil.Process(self.proc.pid)
        threading.Thread(target=self._read_events, daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()
        return self

    def _read_events(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = parse_event(line)
            if event is not None:
                self.events.append(event)

    def _sample(self) -> None:
        count = 0
        while self.proc.poll() is None:
            tree = self._tree()
            self.memory.sample(self._root, tree)
            self.cpu.sample(tree)
            if count % PROBE_EVERY == 0:
                self.speed.sample()
            count += 1
            time.sleep(SAMPLE_SECONDS)

    def _tree(self) -> list[psutil.Process]:
        """The launched process and every descendant now ([] once it is gone)."""
        try:
            return [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            return []

    def alive(self) -> bool:
        return self.proc.poll() is None

    def batches(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == "batch" and e.get("records")]

    def records(self) -> int:
        return sum(int(e["records"]) for e in self.batches())

    def ready_at(self) -> float | None:
        return next((e["t"] for e in self.events if e["event"] == "ready"), None)

    def wait_for(self, what: str, done: Any, timeout: float) -> None:
        """Wait until ``done()``; a clear error when the process died or time ran out."""
        deadline = time.monotonic() + timeout
        while not done():
            if not self.alive():
                raise RuntimeError(
                    f"the pipeline exited ({self.proc.returncode}) before {what}; see {self.log}"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout:.0f} s; see {self.log}")
            time.sleep(0.05)

    def kill(self) -> float:
        """SIGKILL the whole group, as a crash would; return when it was sent."""
        tree = self._tree()
        self.cpu.sample(tree)  # up to the kill: the last batch came just before it
        killed_at = time.time()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        for proc in tree:  # Spark's worker daemon may sit in a group of its own
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(tree, timeout=30)
        self.proc.wait(30)
        self._stderr.close()
        return killed_at
