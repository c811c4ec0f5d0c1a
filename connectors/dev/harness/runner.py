"""Start, watch, crash and restart the pipeline process until it finishes its input."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from eos_connectors.core import faults
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness import layouts
from eos_connectors.dev.harness.cells import DRIVER_POINTS, Target
from eos_connectors.dev.harness.network import NetworkFaults
from eos_connectors.dev.harness.pipeline import parse_event
from eos_connectors.dev.harness.plan import (
    DRIVER_PARTITION,
    CrashService,
    Names,
    Plan,
    step_entries,
)
from eos_connectors.dev.harness.report import Run
from eos_connectors.dev.harness.services import broker_nodes
from eos_connectors.dev.harness.spec import PipelineSpec
from eos_connectors.ops.locations import location


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a pipeline's whole process group (driver, JVM, Python workers) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


#: How often the batches committed to checkpoints on a shared store are counted.
REMOTE_POLL_SECONDS = 1.0


class Runner:
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
        crash_service: CrashService | None,
        network: NetworkFaults | None = None,
    ) -> None:
        self.plan = plan
        self.endpoints = endpoints
        self.names = names
        self.chosen = chosen
        self.out = out
        self.crash_service = crash_service
        self.rng = random.Random(plan.seed)
        self.markers = plan.work_dir / "fired"
        self.checkpoint = location(plan.checkpoints)
        self.entries = entries
        disruptions = ["kill"] * plan.kills + [f"restart {s}" for s in plan.restarts]
        self.rng.shuffle(disruptions)
        self.disruptions = disruptions
        # broker kills end no run: several may fall in one, each after the query has
        # committed a batch since the one before
        self.broker_kills = list(plan.broker_kills)
        self.rng.shuffle(self.broker_kills)
        self.network = network
        self._step_entries = step_entries(plan, chosen)  # hold entry -> its step fault
        self.network_faults = list(plan.network_faults)
        self.rng.shuffle(self.network_faults)
        self._outages: list[str] = []
        self._disrupted = False
        self._service_crashed: str | None = None
        self._committed_at_failure = -1
        self.per_batch = plan.batch_offsets(chosen)
        self._shown = -1
        self._standby: tuple[subprocess.Popen[bytes], Path] | None = None
        self._listed, self._listed_at = 0, -REMOTE_POLL_SECONDS
        self._run_number = 0
        self.spec_path = self._spec().write(plan.work_dir / "pipeline.json")

    def _spec(self) -> PipelineSpec:
        queries = tuple(
            replace(
                t.query(self.endpoints, self.names.topic(t.cell), self.plan.custom_sinks),
                max_offsets=self.per_batch[t.name],
            )
            for t in self.chosen
        )
        driver_faults = sum(1 for e in self.entries if faults.Entry.parse(e).point in DRIVER_POINTS)
        register = tuple(c.register for c in self.plan.custom_sinks if c.register)
        return PipelineSpec(
            bootstrap=self.endpoints.kafka_bootstrap,
            checkpoint=str(self.checkpoint),
            queries=queries,
            max_offsets=min(self.per_batch.values()),
            register=tuple(dict.fromkeys(register)),
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
                kill_group(self._standby[0])
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
                failed = [p for r in runs for p in self._broker_run_failed(r)]
                refused = [e for r in runs for e in self._events(r.number, "refused")]
                crossing = layouts.refusal_problems(list(self._spec().queries), refused)
                return runs, self._not_done() + self._unplanned_failures(runs) + failed + crossing
        return runs, [f"The pipeline did not finish in {limit} runs."]

    # -- one run ---------------------------------------------------------------------

    def _one_run(self, number: int, disruption: str | None) -> Run:
        fired_before = set(faults.fired(self.markers))
        self._disrupted = False
        self._service_crashed = None
        self._outages = []
        began = time.monotonic()
        self._run_number = number
        proc = self._start(number)
        try:
            ended_by = self._watch(proc, disruption)
        finally:
            kill_group(proc)
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
        crashed = [*self._outages, *filter(None, [self._service_crashed])]
        return Run(
            number,
            proc.returncode,
            ended_by,
            seconds,
            ", ".join(crashed) or None,
            new,
            self._query_failures(number),
        )

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
        once slow each other down), start the standby for the next run, if a crash of
        the whole pipeline is still planned: a standby's Spark and its warm-up cost 12-15
        s of CPU, which a run that ends by finishing would only lose to (a pipeline that
        fails unplanned restarts cold). Not on a cluster: a second application would
        wait for executors the first one holds."""
        if self._standby is None and not self.plan.on_cluster and self._crash_ahead():
            self._standby = (self._spawn(number + 1, standby=True), self._go(number + 1))

    def _crash_ahead(self) -> bool:
        """Whether a planned crash of the whole pipeline is still to come: a kill at a
        random moment, or a fault point of the whole group that has not fired yet."""
        if "kill" in self.disruptions:
            return True
        fired = set(faults.fired(self.markers))
        return any(faults.Entry.parse(e).scope == "group" and e not in fired for e in self.entries)

    def _spawn(self, number: int, standby: bool = False) -> subprocess.Popen[bytes]:
        command = self._command() + (["--standby", str(self._go(number))] if standby else [])
        with open(self._log(number), "wb") as log:
            return subprocess.Popen(
                command,
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _go(self, number: int) -> Path:
        return self.plan.work_dir / f"run-{number:03d}.go"

    def _watch(self, proc: subprocess.Popen[bytes], disruption: str | None) -> str:
        """Wait for the process; disrupt it once it has progressed; kill it when it stalls.
        The standby for the next run starts with the first progress."""
        committed = self._committed()
        last_progress = time.monotonic()
        disrupt_at: float | None = None
        done_disruption: str | None = None
        broker_at: float | None = None
        while proc.poll() is None:
            time.sleep(0.2)
            now = time.monotonic()
            fired = faults.fired(self.markers)  # one look at the markers a tick
            self._resume_zombies(fired)
            self._step_faults(fired)
            current = self._committed()
            if current != committed:
                committed, last_progress = current, now
                self._prepare_standby(self._run_number)
                if disruption and disrupt_at is None:
                    disrupt_at = now + self.rng.uniform(0.0, 3.0)
                if (self.broker_kills or self.network_faults) and broker_at is None:
                    broker_at = now + self.rng.uniform(0.0, 3.0)
                self._progress_bar(current)
            if broker_at is not None and now >= broker_at:
                self._next_outage()
                broker_at, last_progress = None, time.monotonic()
            if disrupt_at is not None and now >= disrupt_at and done_disruption is None:
                done_disruption = self._disrupt(proc, disruption or "")
                if done_disruption == "kill":
                    return "kill"
            if now - last_progress > self.plan.stall_timeout:
                return "stalled"
        if done_disruption:  # a service restart: whatever the query did then is a crash
            return done_disruption if proc.returncode != 0 else "exited"
        return "exited"

    def _resume_zombies(self, fired: dict[str, dict[str, object]]) -> None:
        """A paused task attempt (a zombie, its executor killed) goes on once its batch
        is committed: it then prepares after the decision (protocol rule 4)."""
        for entry, where in fired.items():
            if faults.Entry.parse(entry).action != "pause":
                continue
            resume = self.markers / f"{entry}.resume"
            batch = self.checkpoint / str(where.get("query")) / "commits" / str(where.get("batch"))
            if not resume.exists() and batch.exists():
                resume.touch()

    def _step_faults(self, fired: dict[str, dict[str, object]]) -> None:
        """A query held at a protocol step (``hold``): crash the service of its step fault
        and let it go on (the coordinator: while it is down; a store: once it is back)."""
        for entry in fired:
            parsed = faults.Entry.parse(entry)
            resume = self.markers / f"{entry}.resume"
            name = self._step_entries.get(entry)
            if name is None or resume.exists():
                continue
            if name == DRIVER_PARTITION:
                assert self.network is not None
                self.out.write(f"  held at {entry}: cutting the driver off PostgreSQL\n")
                self.network.partition_driver(meanwhile=resume.touch)
                self._outages.append(f"postgres driver partition (at {parsed.point})")
                continue
            assert self.crash_service is not None
            if name == "coordinator":
                node = ",".join(broker_nodes(self.chosen, self.names, "coordinator"))
                self.out.write(f"  held at {entry}: killing {node}, the coordinator\n")
                self.crash_service(node, meanwhile=resume.touch)
                self._outages.append(f"{node} (coordinator at {parsed.point})")
            else:
                self.out.write(f"  held at {entry}: restarting {name}\n")
                self.crash_service(name)
                resume.touch()
                self._outages.append(f"{name} (restarted at {parsed.point})")

    def _next_outage(self) -> None:
        """A broker kill or a network fault (they end no run), whichever is planned next."""
        if self.broker_kills:
            self._kill_broker(self.broker_kills.pop(0))
            return
        fault = self.network_faults.pop(0)
        service, _, kind = fault.partition(":")
        assert self.network is not None
        self.out.write(f"  network fault: {kind} on {service}\n")
        self.network.inject(service, kind)
        self._outages.append(f"{service} network {kind}")

    def _kill_broker(self, role: str) -> None:
        """SIGKILL the broker of the replicated Kafka that has ``role`` now and start it
        again (the query goes on meanwhile)."""
        assert self.crash_service is not None
        node = ",".join(broker_nodes(self.chosen, self.names, role))
        self.out.write(f"  killing {node}, the {role}, and starting it again\n")
        self.crash_service(node)
        self._outages.append(f"{node} ({role})")

    def _disrupt(self, proc: subprocess.Popen[bytes], disruption: str) -> str:
        self._disrupted = True
        if disruption == "kill":
            os.killpg(proc.pid, signal.SIGKILL)
            return "kill"
        assert self.crash_service is not None
        service = disruption.removeprefix("restart ")
        self.crash_service(service)
        self._service_crashed = service
        return f"{service} restart"

    # -- the pipeline --------------------------------------------------------------

    def _command(self) -> list[str]:
        return [sys.executable, "-m", "eos_connectors.dev.harness.pipeline", str(self.spec_path)]

    def _env(self) -> dict[str, str]:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("EOS_FAULT")}
        environment.update(self.endpoints.as_env())
        if self.network is not None:
            environment.update(self.network.driver_env())
        # the package is installed; the working directory holds a connector author's
        # own modules (--sink-register, --sink-reader)
        paths = [str(Path.cwd()), environment.get("PYTHONPATH", "")]
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
            if _excused(run):
                continue
            planned = Counter(
                e.query
                for e in map(faults.Entry.parse, run.faults)
                if e.point in DRIVER_POINTS and e.scope == "process"
            )
            for query, count in run.query_failures.items():
                if count > planned.get(query, 0):
                    errors = [
                        e["error"] for e in self._sink_failures(run.number) if e["query"] == query
                    ]
                    problems.append(
                        f"Query {query} failed {count} time(s) in run {run.number}, "
                        f"{planned.get(query, 0)} planned: {errors}"
                    )
        return problems

    @staticmethod
    def _broker_run_failed(run: Run) -> list[str]:
        """A run whose pipeline failed after a broker of a replicated Kafka (``kafka-<n>``)
        was killed in it: with replication 3 that must not happen."""
        if run.ended_by != "failed" or _excused(run) or not run.service_crashed:
            return []
        return [f"Run {run.number} failed (exit {run.exit_code}) after {run.service_crashed}."]

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
        missing += [f"broker {role}" for role in self.broker_kills]
        missing += [f"network {fault}" for fault in self.network_faults]
        problems = []
        if missing:
            problems.append(
                f"Planned crashes never happened (too few batches?): {', '.join(missing)}"
            )
        asleep = [
            e
            for e in fired
            if faults.Entry.parse(e).action == "pause"
            and not (self.markers / f"{e}.resumed").exists()
        ]
        if asleep:
            problems.append(f"Zombies never resumed after their batch committed: {asleep}")
            for entry in asleep:  # the pipeline's own worker processes: end them
                with contextlib.suppress(ProcessLookupError, TypeError, ValueError):
                    os.kill(int(fired[entry]["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
        return problems

    # -- watching ------------------------------------------------------------------

    def _committed(self) -> int:
        """Batches committed so far, summed over the queries. Checkpoints on a shared store
        (HDFS) are listed at most once every :data:`REMOTE_POLL_SECONDS`: each listing is
        several NameNode calls through a JVM, and the watch loop ticks five times a
        second."""
        now = time.monotonic()
        remote = not isinstance(self.checkpoint, Path)
        if remote and now - self._listed_at < REMOTE_POLL_SECONDS:
            return self._listed
        self._listed_at = now
        self._listed = (
            sum(
                1
                for d in self.checkpoint.glob("*/commits")
                for f in d.iterdir()
                if f.name.isdigit()
            )
            if self.checkpoint.exists()
            else 0
        )
        return self._listed

    def _progress_bar(self, committed: int) -> None:
        total = sum(-(-self.plan.records // per) for per in self.per_batch.values())
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
        print(
            f"\nrun {run.number}: {run.ended_by}{service}{inside} after {run.seconds:.0f} s "
            f"(crashes so far: {crashes})",
            file=self.out,
            flush=True,
        )


def _excused(run: Run) -> bool:
    """Whether query failures in ``run`` are expected: a service crashed or a network
    fault hit it, or two brokers were down together (``min-isr``: the query may fail and
    replay). One broker of a replicated Kafka (``kafka-<n> (role)``) excuses nothing."""
    crashed = [c for c in (run.service_crashed or "").split(", ") if c]
    return any(not c.startswith("kafka-") or c.endswith("(min-isr)") for c in crashed)
