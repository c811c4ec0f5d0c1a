"""``eos verify``: crash a real pipeline at every fault point of every sink, then count.

The harness writes transactional input (every fourth transaction aborted; for the
event-time cell with out-of-order and late timestamps) and knows what each sink
must end up holding; runs one pipeline process (``connectors.harness.pipeline``)
holding one streaming query per (cell, sink) of the plan (see ``cells.py``);
arms every fault point of every sink, each addressed to its own query
(``after-decision@2:rc-postgres=process``), so every point provably fires where it
is planned; kills the pipeline at random moments and, optionally, a service;
restarts the pipeline from its checkpoints until all input is processed; and
compares each sink with what it must hold (see ``checks.py``).

Faults take two forms. ``process`` kills the Python process at the point: in a
task, Spark retries the task (another attempt replaces the dead one's unit); in
the driver's commit, the query fails and the pipeline restarts it from its
checkpoint, in the same Spark session, as an orchestrator would. ``group`` kills
the whole pipeline, as a machine crash would, and the harness restarts it. Two
points are ``group`` crashes (one in a task, one in the driver's commit, of two
kinds of sink); the rest are ``process`` kills (``Plan.full_crashes="all"`` makes
every point a ``group`` crash).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from connectors import faults
from connectors.endpoints import Endpoints
from connectors.errors import EosError
from connectors.harness import checks
from connectors.harness.cells import (
    CELLS,
    DRIVER_POINTS,
    CustomSink,
    Target,
    targets,
    window_counts,
)
from connectors.harness.data import produce_timed_words, produce_words
from connectors.harness.pipeline import parse_event
from connectors.harness.spec import PipelineSpec
from connectors.topics import create_topic, read_to_end

FAMILIES = ("kafka", "postgres", "redis")
SERVICES = ("kafka", "postgres", "redis")

__all__ = ["CELLS", "FAMILIES", "SERVICES", "CustomSink", "Plan", "Report", "VerifyError", "verify"]


class VerifyError(EosError):
    """The harness could not run the pipeline to the end (the message says why)."""


@dataclass(frozen=True)
class Plan:
    records: int = 20_000
    cells: tuple[str, ...] = ("running-count",)
    sinks: tuple[str, ...] = FAMILIES  # which sink families of each cell
    custom: CustomSink | None = None
    fault_rounds: int = 1  # each point of each sink fires this many times
    kills: int = 1  # SIGKILLs of the whole pipeline at random moments
    restarts: tuple[str, ...] = ()  # services to SIGKILL and start again mid-run
    full_crashes: str = "mixed"  # "mixed": GROUP_POINTS as group crashes; "all"; "none"
    partitions: int = 2  # of each input topic
    shuffle_partitions: int = 2  # units per batch of a stateful query's sink
    words: int = 40
    seed: int = 7
    stall_timeout: float = 240.0
    master: str | None = None  # a Spark master URL; default local mode
    work_dir: Path = field(default_factory=lambda: Path("verify-runs") / uuid.uuid4().hex[:8])

    @property
    def on_cluster(self) -> bool:
        return self.master is not None and self.master.startswith("spark://")

    def batches_needed(self, points_per_query: int) -> int:
        """Each query crosses its own points one batch apart, from batch 1, plus the
        source's point and two to spare (kills and service restarts come at random
        moments, whatever the batch)."""
        return points_per_query * self.fault_rounds + 3


@dataclass
class Run:
    number: int
    exit_code: int
    ended_by: str  # "finished", "fault <entry>", "kill", "<service> restart", "failed"
    seconds: float
    service_crashed: str | None = None  # a service SIGKILLed and restarted during the run
    faults: list[str] = field(default_factory=list)  # points that fired in this run
    query_failures: dict[str, int] = field(default_factory=dict)

    @property
    def crashes(self) -> int:
        """Whole-pipeline crashes plus service crashes in this run."""
        pipeline = self.ended_by not in ("finished", "failed", "stalled")
        service = self.service_crashed is not None and not self.ended_by.endswith("restart")
        return int(pipeline) + int(service)


@dataclass
class Report:
    plan: dict[str, Any]
    runs: list[Run]
    sinks: list[checks.SinkResult]
    problems: list[str]
    fired: dict[str, dict[str, Any]] = field(default_factory=dict)  # entry -> where it fired

    @property
    def crashes(self) -> int:
        return sum(r.crashes for r in self.runs)

    @property
    def ok(self) -> bool:
        return not self.problems and all(s.ok for s in self.sinks)

    def to_json(self) -> str:
        return json.dumps(
            {"ok": self.ok, "crashes": self.crashes, **asdict(self)}, indent=2, default=str
        )

    def table(self) -> str:
        head = f"| {'sink':<18} | {'expected':>9} | {'lost':>5} | {'duplicated':>10} "
        head += f"| {'wrong':>5} | {'leftovers':>9} | {'verdict':<7} |"
        lines = [head, "|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|"]
        for s in self.sinks:
            lines.append(
                f"| {s.sink:<18} | {s.expected:>9,} | {s.lost:>5} | {s.duplicated:>10} "
                f"| {s.wrong:>5} | {len(s.leftovers):>9} | {'OK' if s.ok else 'FAIL':<7} |"
            )
        return "\n".join(lines)

    def run_of(self, entry: str) -> int | None:
        """The run in which a planned point fired (None: it never did)."""
        return next((run.number for run in self.runs if entry in run.faults), None)

    def fault_table(self) -> str:
        """Every planned point and where it fired: query, batch, role, run."""
        lines = ["| planned point | fired in query | batch | role | run |",
                 "|---|---|--:|---|--:|"]  # fmt: skip
        for entry in self.plan["schedule"]:
            where = self.fired.get(entry)
            if where is None:
                lines.append(f"| {entry} | **never fired** | | | |")
            else:
                lines.append(f"| {entry} | {where.get('query')} | {where.get('batch')} "
                             f"| {where.get('role')} | {self.run_of(entry) or ''} |")  # fmt: skip
        return "\n".join(lines)


class Names:
    """Topics of one harness run (sink outputs are named by ``cells.Target``)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.words = f"verify-in-{tag}"
        self.timed = f"verify-in-timed-{tag}"


#: The whole-pipeline crash of a "mixed" plan: at a task's point, in the first kind of
#: sink that has it. It costs a run (a Spark restart and every query's first batch) and
#: takes a path of its own: the prepared unit is left to a replay by a new run, where a
#: killed task process is retried within the batch. The other points kill only the
#: process at the point (or, on a cluster, the executor). At a driver point that leaves
#: the store as a whole crash would (the commit runs in its own Python process, the
#: query restarts and replays the batch), and the random kill restarts Spark anyway.
GROUP_POINTS = ("after-prepare",)
MIXED_GROUP_CRASHES = len(GROUP_POINTS)


def schedule(plan: Plan, chosen: list[Target]) -> list[str]:
    """Each query's points, one per batch from batch 1, and the source's point once, each
    with its query's action (:meth:`Target.action`), except the :data:`GROUP_POINTS`
    crashes of the whole pipeline; with ``full_crashes="all"`` every point is one."""
    entries: list[str] = []
    crashed: list[str] = []  # families that have their whole-pipeline crash
    for target in chosen:
        for text in faults.schedule(target.points, plan.fault_rounds, query=target.name):
            entry = faults.Entry.parse(text)
            zombie = target.action(entry.point) == "pause"
            whole = (plan.full_crashes == "all" and not zombie) or (
                plan.full_crashes == "mixed"
                and len(crashed) < len(GROUP_POINTS)
                and target.family not in crashed
                and entry.point == GROUP_POINTS[len(crashed)]
            )
            if whole and target.family not in crashed:
                crashed.append(target.family)
            action = "group" if whole else target.action(entry.point)
            entries.append(str(faults.Entry(entry.point, entry.batch, entry.query, action)))
    first = chosen[0]
    # The source's replay after a crash mid-read is a local-mode proof (the cells and
    # tests/integration/test_source_replay.py); on a cluster it would cost one more lost
    # executor and resubmitted stage and prove nothing about the sinks.
    if plan.fault_rounds and not plan.on_cluster:
        batch = len(first.points) * plan.fault_rounds + 1
        action = "group" if plan.full_crashes == "all" else first.action("source-read")
        entries.append(str(faults.Entry("source-read", batch, first.name, action)))
    return entries


def verify(
    plan: Plan,
    endpoints: Endpoints,
    out: TextIO = sys.stderr,
    crash_service: Callable[[str], None] | None = None,
) -> Report:
    """Run ``plan`` against real services; the report says what each sink holds."""
    _check_plan(plan, crash_service)
    from connectors.spark import ensure_class_archive

    names = Names(uuid.uuid4().hex[:10])
    chosen = targets(plan.cells, plan.sinks, names.tag, plan.custom, plan.on_cluster)
    plan.work_dir.mkdir(parents=True, exist_ok=True)
    expected_words = _write_input(plan, endpoints, names, chosen, out)
    for target in chosen:
        if target.family == "kafka":
            create_topic(endpoints.kafka_bootstrap, target.output, 2)
    ensure_class_archive()
    entries = schedule(plan, chosen)
    runner = _Runner(plan, endpoints, names, chosen, entries, out, crash_service)
    runs, problems = runner.run_to_the_end()
    results = []
    if not problems:
        results = _check_sinks(plan, endpoints, names, chosen, expected_words, runner.checkpoint)
    fired = faults.fired(runner.markers)
    shown = {**asdict(plan), "custom": plan.custom.public() if plan.custom else None}
    report = Report({**shown, "schedule": entries}, runs, results, problems, fired)
    (plan.work_dir / "report.json").write_text(report.to_json())
    return report


def _write_input(
    plan: Plan, endpoints: Endpoints, names: Names, chosen: list[Target], out: TextIO
) -> Counter[str]:
    vocabulary = tuple(f"w{i:05d}" for i in range(plan.words))
    bootstrap = endpoints.kafka_bootstrap
    print(f"Writing {plan.records:,} records per input (every 4th transaction aborted)...",
          file=out, flush=True)  # fmt: skip
    expected: Counter[str] = Counter()
    if any(not t.cell.timed for t in chosen):
        create_topic(bootstrap, names.words, plan.partitions)
        expected = produce_words(bootstrap, names.words, plan.records, plan.seed, vocabulary)
    if any(t.cell.timed for t in chosen):
        # Event times lie in the past: keep the records whatever their age (retention
        # deletes by timestamp).
        create_topic(bootstrap, names.timed, plan.partitions, **{"retention.ms": "-1"})
        produce_timed_words(bootstrap, names.timed, plan.records, plan.seed, vocabulary)
    return expected


def _check_plan(plan: Plan, crash_service: Callable[[str], None] | None) -> None:
    unknown = [c for c in plan.cells if c not in CELLS]
    if unknown:
        raise VerifyError(f"Unknown cell {unknown[0]!r}: cells are {', '.join(CELLS)}.")
    bad_sinks = [s for s in plan.sinks if s not in FAMILIES]
    if bad_sinks:
        raise VerifyError(
            f"Unknown sink {bad_sinks[0]!r}: built-in sinks are {', '.join(FAMILIES)}; "
            "name your own with --sink-format (and --sink-reader)."
        )
    if not plan.sinks and plan.custom is None:
        raise VerifyError("No sink to verify: name at least one.")
    bad = [s for s in plan.restarts if s not in SERVICES]
    if bad:
        raise VerifyError(f"Cannot restart {bad[0]!r}: services are {', '.join(SERVICES)}.")
    if plan.restarts and crash_service is None:
        raise VerifyError(
            "Service restarts need the package's own stack (`eos stack up`), not endpoints "
            "from EOS_* variables."
        )
    if plan.full_crashes not in ("mixed", "all", "none"):
        raise VerifyError(f"full_crashes={plan.full_crashes!r}: choose 'mixed', 'all' or 'none'.")
    if plan.records < plan.batches_needed(4) * 50:
        raise VerifyError(
            f"{plan.records} records are too few for {plan.batches_needed(4)} batches of at "
            "least 50 records: raise --records or lower the crash counts."
        )


def _check_sinks(
    plan: Plan,
    endpoints: Endpoints,
    names: Names,
    chosen: list[Target],
    words: Counter[str],
    checkpoint: Path,
) -> list[checks.SinkResult]:
    timed: list[Any] = []
    if any(t.cell.timed for t in chosen):
        timed = read_to_end(endpoints.kafka_bootstrap, names.timed)
    results = []
    for target in chosen:
        expected: Mapping[str, int] = words
        if target.cell.timed:
            expected = window_counts(timed, checkpoint / target.name)
        observed = target.observed(endpoints, plan.custom)
        results.append(checks.compare(target.name, expected, observed))
    return results


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a pipeline's whole process group (driver, JVM, Python workers) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class _Runner:
    """Start, watch, crash and restart the pipeline until it finishes its input.

    A standby pipeline process is kept one run ahead: started with ``--standby``, it
    brings Spark up and warms it, then waits; the next run tells it to go. A crash
    then costs the queries' restart, not Spark's start-up (about 20 s on 2 cores).
    """

    def __init__(
        self,
        plan: Plan,
        endpoints: Endpoints,
        names: Names,
        chosen: list[Target],
        entries: list[str],
        out: TextIO,
        crash_service: Callable[[str], None] | None,
    ) -> None:
        self.plan = plan
        self.endpoints = endpoints
        self.names = names
        self.chosen = chosen
        self.out = out
        self.crash_service = crash_service
        self.rng = random.Random(plan.seed)
        self.markers = plan.work_dir / "fired"
        self.checkpoint = plan.work_dir / "checkpoint"
        self.entries = entries
        disruptions = ["kill"] * plan.kills + [f"restart {s}" for s in plan.restarts]
        self.rng.shuffle(disruptions)
        self.disruptions = disruptions
        self._disrupted = False
        self._service_crashed: str | None = None
        self._committed_at_failure = -1
        points = max(len(t.points) for t in chosen)
        self.per_batch = max(10, plan.records // plan.batches_needed(points))
        self._shown = -1
        self._standby: tuple[subprocess.Popen[bytes], Path] | None = None
        self._run_number = 0
        self.spec_path = self._spec().write(plan.work_dir / "pipeline.json")

    def _spec(self) -> PipelineSpec:
        queries = tuple(
            t.query(self.endpoints, self.names.timed if t.cell.timed else self.names.words,
                    self.plan.custom)
            for t in self.chosen
        )  # fmt: skip
        driver_faults = sum(1 for e in self.entries if faults.Entry.parse(e).point in DRIVER_POINTS)
        custom = self.plan.custom
        return PipelineSpec(
            bootstrap=self.endpoints.kafka_bootstrap,
            checkpoint=str(self.checkpoint),
            queries=queries,
            max_offsets=self.per_batch,
            register=(custom.register,) if custom and custom.register else (),
            master=self.plan.master,
            conf={"spark.sql.shuffle.partitions": str(self.plan.shuffle_partitions)},
            events=True,
            restart_failed=driver_faults + 3,
            app="eos-verify",
        )

    def run_to_the_end(self) -> tuple[list[Run], list[str]]:
        try:
            return self._runs()
        finally:
            if self._standby is not None:
                _kill(self._standby[0])
                self._standby = None

    def _runs(self) -> tuple[list[Run], list[str]]:
        runs: list[Run] = []
        limit = len(self.entries) + len(self.disruptions) + 5
        while len(runs) < limit:
            disruption = self.disruptions[0] if self.disruptions else None
            run = self._one_run(len(runs) + 1, disruption)
            if self._disrupted:
                self.disruptions.pop(0)
            runs.append(run)
            self._progress(runs)
            if run.ended_by == "failed" and self._failed_twice_in_a_row():
                return runs, [self._failure(run)]
            if run.ended_by == "stalled":
                return runs, [
                    f"The pipeline made no progress for {self.plan.stall_timeout:.0f} s "
                    f"(run {run.number}); it was killed. Its log: {self._log(run.number)}\n"
                    + self._tail(run.number)
                ]
            if run.ended_by == "finished":
                return runs, self._not_done() + self._unplanned_failures(runs)
        return runs, [f"The pipeline did not finish in {limit} runs."]

    # -- one run ---------------------------------------------------------------------

    def _one_run(self, number: int, disruption: str | None) -> Run:
        fired_before = set(faults.fired(self.markers))
        self._disrupted = False
        self._service_crashed = None
        began = time.monotonic()
        self._run_number = number
        proc = self._start(number)
        try:
            ended_by = self._watch(proc, disruption)
        finally:
            _kill(proc)
        new = sorted(set(faults.fired(self.markers)) - fired_before)
        whole = [e for e in new if faults.Entry.parse(e).scope == "group"]
        if whole:
            ended_by = f"fault {whole[0]}"
            # A fault that fires in the same run as a planned kill makes one crash, not
            # two: the kill stays planned for a later run, so every planned crash happens.
            if disruption == "kill":
                self._disrupted = False
        elif ended_by == "exited":
            ended_by = "finished" if proc.returncode == 0 else "failed"
        seconds = round(time.monotonic() - began, 1)
        return Run(number, proc.returncode, ended_by, seconds, self._service_crashed, new,
                   self._query_failures(number))  # fmt: skip

    def _start(self, number: int) -> subprocess.Popen[bytes]:
        """Run ``number``: the standby started during the run before (its Spark already
        up and warm) is told to go; a new standby is started for the next run."""
        if self._standby is not None:
            proc, go = self._standby
            self._standby = None
            go.touch()
            return proc
        return self._spawn(number)

    def _prepare_standby(self, number: int) -> None:
        """Once run ``number`` has committed a batch (not before: two Spark start-ups at
        once slow each other down), start the standby for the next run. Not on a
        cluster: a second application would wait for executors the first one holds."""
        if self._standby is None and not self.plan.on_cluster:
            self._standby = (self._spawn(number + 1, standby=True), self._go(number + 1))

    def _spawn(self, number: int, standby: bool = False) -> subprocess.Popen[bytes]:
        command = self._command() + (["--standby", str(self._go(number))] if standby else [])
        with open(self._log(number), "wb") as log:
            return subprocess.Popen(command, env=self._env(), stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip

    def _go(self, number: int) -> Path:
        return self.plan.work_dir / f"run-{number:03d}.go"

    def _watch(self, proc: subprocess.Popen[bytes], disruption: str | None) -> str:
        """Wait for the process; disrupt it once it has progressed; kill it when it stalls.
        The standby for the next run starts with the first progress."""
        committed = self._committed()
        last_progress = time.monotonic()
        disrupt_at: float | None = None
        done_disruption: str | None = None
        while proc.poll() is None:
            time.sleep(0.2)
            now = time.monotonic()
            self._resume_zombies()
            current = self._committed()
            if current != committed:
                committed, last_progress = current, now
                self._prepare_standby(self._run_number)
                if disruption and disrupt_at is None:
                    disrupt_at = now + self.rng.uniform(0.0, 3.0)
                self._progress_bar(current)
            if disrupt_at is not None and now >= disrupt_at and done_disruption is None:
                done_disruption = self._disrupt(proc, disruption or "")
                if done_disruption == "kill":
                    return "kill"
            if now - last_progress > self.plan.stall_timeout:
                return "stalled"
        if done_disruption:  # a service restart: whatever the query did then is a crash
            return done_disruption if proc.returncode != 0 else "exited"
        return "exited"

    def _resume_zombies(self) -> None:
        """A paused task attempt (a zombie, its executor killed) goes on once its batch
        is committed: it then prepares after the decision (protocol rule 4)."""
        for entry, where in faults.fired(self.markers).items():
            if faults.Entry.parse(entry).action != "pause":
                continue
            resume = self.markers / f"{entry}.resume"
            batch = self.checkpoint / str(where.get("query")) / "commits" / str(where.get("batch"))
            if not resume.exists() and batch.exists():
                resume.touch()

    def _disrupt(self, proc: subprocess.Popen[bytes], disruption: str) -> str:
        self._disrupted = True
        if disruption == "kill":
            os.killpg(proc.pid, signal.SIGKILL)
            return "kill"
        service = disruption.removeprefix("restart ")
        assert self.crash_service is not None
        self.crash_service(service)
        self._service_crashed = service
        return f"{service} restart"

    # -- the pipeline --------------------------------------------------------------

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "connectors.harness.pipeline", str(self.spec_path)]

    def _env(self) -> dict[str, str]:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("EOS_FAULT")}
        environment.update(self.endpoints.as_env())
        root = str(Path(__file__).resolve().parents[2])
        paths = [root, str(Path.cwd()), environment.get("PYTHONPATH", "")]
        environment["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        if self.entries:
            environment["EOS_FAULT_POINT"] = ",".join(self.entries)
            environment["EOS_FAULT_MARKER"] = str(self.markers)
        return environment

    def _log(self, number: int) -> Path:
        return self.plan.work_dir / f"run-{number:03d}.log"

    def _tail(self, number: int, lines: int = 25) -> str:
        text = self._log(number).read_text(errors="replace").splitlines()
        interesting = [line for line in text if " WARN " not in line and line.strip()]
        return "\n".join(interesting[-lines:])

    def _events(self, number: int, kind: str) -> list[dict[str, Any]]:
        lines = self._log(number).read_text(errors="replace").splitlines()
        events = (parse_event(line) for line in lines)
        return [e for e in events if e is not None and e.get("event") == kind]

    def _query_failures(self, number: int) -> dict[str, int]:
        """Failures per query, but those where no sink code had run: while Spark
        initialised the query's sources, or a Python worker that never started (the
        pipeline restarts such a query itself; see ``pipeline.Supervisor``)."""
        return dict(Counter(e["query"] for e in self._sink_failures(number)))

    def _sink_failures(self, number: int) -> list[dict[str, Any]]:
        failures = self._events(number, "query-failed")
        return [e for e in failures if not e.get("initializing") and not e.get("starved")]

    def _unplanned_failures(self, runs: list[Run]) -> list[str]:
        """Every query failure must be one of the planned driver-side ``process`` kills (or
        fall in a run where a service was restarted); any other is reported."""
        problems = []
        for run in runs:
            if run.service_crashed:
                continue
            planned = Counter(
                e.query
                for e in map(faults.Entry.parse, run.faults)
                if e.point in DRIVER_POINTS and e.scope == "process"
            )
            for query, count in run.query_failures.items():
                if count > planned.get(query, 0):
                    errors = [e["error"] for e in self._sink_failures(run.number)
                              if e["query"] == query]  # fmt: skip
                    problems.append(
                        f"Query {query} failed {count} time(s) in run {run.number}, "
                        f"{planned.get(query, 0)} planned: {errors}"
                    )
        return problems

    def _failed_twice_in_a_row(self) -> bool:
        """A pipeline that fails on its own is restarted, as an operator would; failing
        before any batch ever committed, or again without committing a batch in
        between, ends the harness run."""
        committed = self._committed()
        repeated = self._committed_at_failure == committed
        self._committed_at_failure = committed
        return repeated or committed == 0

    def _failure(self, run: Run) -> str:
        return (
            f"The pipeline failed on its own (run {run.number}, exit code {run.exit_code}) "
            f"with no crash planned. Its log: {self._log(run.number)}\n{self._tail(run.number)}"
        )

    def _not_done(self) -> list[str]:
        """Planned crashes that did not happen before the input ran out, and zombies that
        never went on after their batch was committed."""
        fired = faults.fired(self.markers)
        missing = sorted(set(self.entries) - set(fired)) + self.disruptions
        problems = []
        if missing:
            problems.append(f"Planned crashes never happened (too few batches?): "
                            f"{', '.join(missing)}")  # fmt: skip
        asleep = [e for e in fired if faults.Entry.parse(e).action == "pause"
                  and not (self.markers / f"{e}.resumed").exists()]  # fmt: skip
        if asleep:
            problems.append(f"Zombies never resumed after their batch committed: {asleep}")
            for entry in asleep:  # the pipeline's own worker processes: end them
                with contextlib.suppress(ProcessLookupError, TypeError, ValueError):
                    os.kill(int(fired[entry]["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
        return problems

    # -- watching ------------------------------------------------------------------

    def _committed(self) -> int:
        """Batches committed so far, summed over the queries."""
        return sum(
            1 for d in self.checkpoint.glob("*/commits") for f in d.iterdir() if f.name.isdigit()
        ) if self.checkpoint.exists() else 0  # fmt: skip

    def _progress_bar(self, committed: int) -> None:
        total = len(self.chosen) * -(-self.plan.records // self.per_batch)
        done = min(1.0, committed / max(1, total))
        width = 30
        bar = "#" * int(done * width) + "-" * (width - int(done * width))
        tty = self.out.isatty()
        if not tty and int(done * 10) == self._shown:
            return  # a log, not a terminal: one line per 10%
        self._shown = int(done * 10)
        end = "\r" if tty else "\n"
        print(f"  [{bar}] {done:4.0%} of the batches committed", end=end, file=self.out, flush=True)

    def _progress(self, runs: list[Run]) -> None:
        run = runs[-1]
        crashes = sum(r.crashes for r in runs)
        service = f", {run.service_crashed} crashed and restarted" if run.service_crashed else ""
        inside = f", {len(run.faults)} fault point(s) fired" if run.faults else ""
        print(f"\nrun {run.number}: {run.ended_by}{service}{inside} after {run.seconds:.0f} s "
              f"(crashes so far: {crashes})", file=self.out, flush=True)  # fmt: skip
