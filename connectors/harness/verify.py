"""``eos verify``: crash a real pipeline again and again, then count what each sink holds.

The harness writes a transactional input topic (every fourth transaction
aborted) and knows the expected word counts; runs ``connectors.harness.pipeline``
(``eos_kafka`` -> running count per word -> every sink under test) as its own OS
process group; crashes it with SIGKILL at each fault point of the protocol and at
random moments, optionally SIGKILLs a service mid-run and starts it again;
restarts the pipeline from its checkpoints until all input is processed; and
finally compares each sink with the expected counts (see ``checks.py``).
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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

from connectors.endpoints import Endpoints
from connectors.errors import EosError
from connectors.faults import POINTS, schedule
from connectors.harness import checks, load
from connectors.harness.data import create_topic, produce_words

BUILT_IN_SINKS = ("kafka", "postgres", "redis")
SERVICES = ("kafka", "postgres", "redis")


class VerifyError(EosError):
    """The harness could not run the pipeline to the end (the message says why)."""


@dataclass(frozen=True)
class CustomSink:
    """A connector author's sink: format name, options, how to register it and read it back.

    The sink receives (word string, count long) rows in append mode: each changed
    word's new running count. ``reader`` (``module:function``) returns the final
    {word: count} the sink holds; ``register`` (``module:Class``) names the
    DataSource to register when the format is not one of this package's.
    """

    format: str
    reader: str
    options: tuple[tuple[str, str], ...] = ()
    register: str | None = None


@dataclass(frozen=True)
class Plan:
    records: int = 20_000
    sinks: tuple[str, ...] = BUILT_IN_SINKS
    custom: CustomSink | None = None
    fault_points: tuple[str, ...] = POINTS
    fault_rounds: int = 1  # each of fault_points fires this many times
    kills: int = 2  # SIGKILLs at random moments
    restarts: tuple[str, ...] = ()  # services to SIGKILL and start again mid-run
    partitions: int = 3
    words: int = 200
    seed: int = 7
    stall_timeout: float = 240.0
    work_dir: Path = field(default_factory=lambda: Path("verify-runs") / uuid.uuid4().hex[:8])

    def batches_needed(self) -> int:
        return len(self.fault_points) * self.fault_rounds + self.kills + len(self.restarts) + 4


@dataclass
class Run:
    number: int
    exit_code: int
    ended_by: str  # "finished", "fault <point>@<batch>", "kill", "<service> restart", "failed"
    seconds: float
    service_crashed: str | None = None  # a service SIGKILLed and restarted during the run

    @property
    def crashes(self) -> int:
        """Pipeline crashes plus service crashes in this run."""
        pipeline = self.ended_by not in ("finished", "failed", "stalled")
        service = self.service_crashed is not None and not self.ended_by.endswith("restart")
        return int(pipeline) + int(service)


@dataclass
class Report:
    plan: dict[str, Any]
    runs: list[Run]
    sinks: list[checks.SinkResult]
    problems: list[str]

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
        head = f"| {'sink':<10} | {'expected':>9} | {'lost':>5} | {'duplicated':>10} "
        head += f"| {'wrong':>5} | {'leftovers':>9} | {'verdict':<7} |"
        lines = [head, "|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|"]
        for s in self.sinks:
            lines.append(
                f"| {s.sink:<10} | {s.expected:>9,} | {s.lost:>5} | {s.duplicated:>10} "
                f"| {s.wrong:>5} | {len(s.leftovers):>9} | {'OK' if s.ok else 'FAIL':<7} |"
            )
        return "\n".join(lines)


class Names:
    """Topics, tables and key prefixes of one harness run."""

    def __init__(self, tag: str) -> None:
        self.input = f"verify-in-{tag}"
        self.output = f"verify-out-{tag}"
        self.table = f"verify_{tag}"
        self.prefix = f"verify:{tag}:"
        self.sink_id = f"verify-{tag}"  # each built-in sink's sinkId: <this>-<sink>


def verify(
    plan: Plan,
    endpoints: Endpoints,
    out: TextIO = sys.stderr,
    crash_service: Callable[[str], None] | None = None,
) -> Report:
    """Run ``plan`` against real services; the report says what each sink holds."""
    _check_plan(plan, crash_service)
    tag = uuid.uuid4().hex[:10]
    names = Names(tag)
    plan.work_dir.mkdir(parents=True, exist_ok=True)
    print(f"Writing {plan.records:,} records (every 4th transaction aborted) to "
          f"{names.input}...", file=out, flush=True)  # fmt: skip
    create_topic(endpoints.kafka_bootstrap, names.input, plan.partitions)
    vocabulary = tuple(f"w{i:05d}" for i in range(plan.words))
    expected = produce_words(
        endpoints.kafka_bootstrap, names.input, plan.records, plan.seed, vocabulary
    )
    if "kafka" in plan.sinks:
        create_topic(endpoints.kafka_bootstrap, names.output, 2)
    runner = _Runner(plan, endpoints, names, out, crash_service)
    runs, problems = runner.run_to_the_end()
    results = _check_sinks(plan, endpoints, names, expected) if not problems else []
    report = Report(asdict(plan), runs, results, problems)
    (plan.work_dir / "report.json").write_text(report.to_json())
    return report


def _check_plan(plan: Plan, crash_service: Callable[[str], None] | None) -> None:
    unknown = [s for s in plan.sinks if s not in BUILT_IN_SINKS]
    if unknown:
        raise VerifyError(
            f"Unknown sink {unknown[0]!r}: built-in sinks are {', '.join(BUILT_IN_SINKS)}; "
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
    unknown_points = [p for p in plan.fault_points if p not in POINTS]
    if unknown_points:
        raise VerifyError(
            f"Unknown fault point {unknown_points[0]!r}: points are {', '.join(POINTS)}."
        )
    if plan.records < plan.batches_needed() * 10:
        raise VerifyError(
            f"{plan.records} records are too few for {plan.batches_needed()} batches: "
            "raise --records or lower the crash counts."
        )


def _check_sinks(
    plan: Plan, endpoints: Endpoints, names: Names, expected: Counter[str]
) -> list[checks.SinkResult]:
    results = []
    if "kafka" in plan.sinks:
        words, repeated, leftovers = checks.kafka_counts(endpoints.kafka_bootstrap, names.output)
        results.append(checks.compare("kafka", expected, words, repeated, leftovers))
    if "postgres" in plan.sinks:
        counts, leftovers = checks.postgres_counts(
            endpoints.postgres_dsn, names.table, f"{names.sink_id}-postgres"
        )
        results.append(checks.compare("postgres", expected, counts, 0, leftovers))
    if "redis" in plan.sinks:
        counts, leftovers = checks.redis_counts(
            endpoints.redis_url, names.prefix, f"{names.sink_id}-redis"
        )
        results.append(checks.compare("redis", expected, counts, 0, leftovers))
    if plan.custom is not None:
        reader = load(plan.custom.reader)
        assert callable(reader), f"{plan.custom.reader} is not callable"
        got = dict(reader())
        results.append(checks.compare(plan.custom.format, expected, got))
    return results


class _Runner:
    """Start, watch, crash and restart the pipeline until it finishes its input."""

    def __init__(
        self,
        plan: Plan,
        endpoints: Endpoints,
        names: Names,
        out: TextIO,
        crash_service: Callable[[str], None] | None,
    ) -> None:
        self.plan = plan
        self.endpoints = endpoints
        self.names = names
        self.out = out
        self.crash_service = crash_service
        self.rng = random.Random(plan.seed)
        self.markers = plan.work_dir / "fired"
        self.checkpoint = plan.work_dir / "checkpoint"
        self.schedule = schedule(plan.fault_points, plan.fault_rounds)
        disruptions = ["kill"] * plan.kills + [f"restart {s}" for s in plan.restarts]
        self.rng.shuffle(disruptions)
        self.disruptions = disruptions
        self._disrupted = False
        self._service_crashed: str | None = None
        self._committed_at_failure = -1
        # Room for every crash: a fault fires in its batch, a disruption needs one more.
        self.per_batch = max(10, plan.records // (plan.batches_needed() + len(disruptions)))
        self._shown = -1

    def run_to_the_end(self) -> tuple[list[Run], list[str]]:
        runs: list[Run] = []
        limit = len(self.schedule) + len(self.disruptions) + 5
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
                return runs, self._not_done()
        return runs, [f"The pipeline did not finish in {limit} runs."]

    # -- one run ---------------------------------------------------------------------

    def _one_run(self, number: int, disruption: str | None) -> Run:
        fired_before = self._fired()
        self._disrupted = False
        self._service_crashed = None
        began = time.monotonic()
        with open(self._log(number), "wb") as log:
            proc = subprocess.Popen(
                self._command(), env=self._env(), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
            try:
                ended_by = self._watch(proc, disruption)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        new = sorted(self._fired() - fired_before)
        if new:
            ended_by = f"fault {new[0]}"
            # A fault that fires in the same run as a planned kill (a Python worker outside
            # the killed group can reach its point a moment later) makes one crash, not
            # two: the kill stays planned for a later run, so every planned crash happens.
            if disruption == "kill":
                self._disrupted = False
        elif ended_by == "exited":
            ended_by = "finished" if proc.returncode == 0 else "failed"
        seconds = round(time.monotonic() - began, 1)
        return Run(number, proc.returncode, ended_by, seconds, self._service_crashed)

    def _watch(self, proc: subprocess.Popen[bytes], disruption: str | None) -> str:
        """Wait for the process; disrupt it once it has progressed; kill it when it stalls."""
        committed = self._committed()
        last_progress = time.monotonic()
        disrupt_at: float | None = None
        done_disruption: str | None = None
        while proc.poll() is None:
            time.sleep(0.2)
            now = time.monotonic()
            current = self._committed()
            if current != committed:
                committed, last_progress = current, now
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
        plan, names = self.plan, self.names
        command = [
            sys.executable, "-m", "connectors.harness.pipeline",
            "--topic", names.input, "--checkpoint", str(self.checkpoint),
            "--state", "processor", "--trigger", "available-now",
            "--max-offsets", str(self.per_batch),
            "--out-topic", names.output, "--table", names.table,
            "--key-prefix", names.prefix, "--redis-mode", "increment",
            "--sink-id", names.sink_id,
        ]  # fmt: skip
        for sink in plan.sinks:
            command += ["--sink", sink]
        if plan.custom is not None:
            command += ["--custom-format", plan.custom.format]
            command += [f"--custom-option={k}={v}" for k, v in plan.custom.options]
            if plan.custom.register:
                command += ["--register", plan.custom.register]
        return command

    def _env(self) -> dict[str, str]:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("EOS_FAULT")}
        environment.update(self.endpoints.as_env())
        root = str(Path(__file__).resolve().parents[2])
        paths = [root, str(Path.cwd()), environment.get("PYTHONPATH", "")]
        environment["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        if self.schedule:
            environment["EOS_FAULT_POINT"] = ",".join(self.schedule)
            environment["EOS_FAULT_SCOPE"] = "group"
            environment["EOS_FAULT_MARKER"] = str(self.markers)
        return environment

    def _log(self, number: int) -> Path:
        return self.plan.work_dir / f"run-{number:03d}.log"

    def _tail(self, number: int, lines: int = 25) -> str:
        text = self._log(number).read_text(errors="replace").splitlines()
        interesting = [line for line in text if " WARN " not in line and line.strip()]
        return "\n".join(interesting[-lines:])

    def _failed_twice_in_a_row(self) -> bool:
        """A query that fails on its own is restarted, as an operator would; failing
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
        """Planned crashes that did not happen before the input ran out."""
        missing = sorted(set(self.schedule) - self._fired()) + self.disruptions
        if not missing:
            return []
        return [f"Planned crashes never happened (too few batches?): {', '.join(missing)}"]

    # -- watching ------------------------------------------------------------------

    def _fired(self) -> set[str]:
        return {p.name for p in self.markers.iterdir()} if self.markers.exists() else set()

    def _committed(self) -> int:
        """Batches committed so far, summed over the sinks' queries."""
        return sum(
            1 for d in self.checkpoint.glob("**/commits") for f in d.iterdir() if f.name.isdigit()
        ) if self.checkpoint.exists() else 0  # fmt: skip

    def _progress_bar(self, committed: int) -> None:
        queries = len(self.plan.sinks) + (self.plan.custom is not None)
        total = queries * -(-self.plan.records // self.per_batch)
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
        print(f"\nrun {run.number}: {run.ended_by}{service} after {run.seconds:.0f} s "
              f"(crashes so far: {crashes})", file=self.out, flush=True)  # fmt: skip
