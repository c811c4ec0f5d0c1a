"""One pipeline as an OS process: its ``EOS-EVENT`` lines, its memory, its SIGKILL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from connectors.harness.pipeline import parse_event

SAMPLE_SECONDS = 0.25


@dataclass
class Memory:
    """Peak resident memory (MB) of the driver (the launched process and its JVM) and
    of the workers (Spark's Python workers, every other process of the tree)."""

    driver_mb: float = 0.0
    workers_mb: float = 0.0

    def sample(self, root: psutil.Process) -> None:
        driver = workers = 0
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for proc in tree:
            try:
                rss = proc.memory_info().rss
                is_driver = proc.pid == root.pid or proc.name() == "java"
            except psutil.Error:
                continue
            if is_driver:
                driver += rss
            else:
                workers += rss
        self.driver_mb = max(self.driver_mb, driver / 2**20)
        self.workers_mb = max(self.workers_mb, workers / 2**20)


@dataclass
class PipelineProcess:
    """Started in its own session, so a SIGKILL of its group takes the JVM and workers too."""

    command: list[str]
    log: Path
    env: dict[str, str]
    events: list[dict[str, Any]] = field(default_factory=list)
    memory: Memory = field(default_factory=Memory)

    def start(self) -> PipelineProcess:
        self._stderr = self.log.open("ab")
        self.proc = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=self._stderr, env={**os.environ,
            **self.env}, start_new_session=True, text=True,
        )  # fmt: skip
        self._root = psutil.Process(self.proc.pid)
        threading.Thread(target=self._read_events, daemon=True).start()
        threading.Thread(target=self._sample_memory, daemon=True).start()
        return self

    def _read_events(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = parse_event(line)
            if event is not None:
                self.events.append(event)

    def _sample_memory(self) -> None:
        while self.proc.poll() is None:
            self.memory.sample(self._root)
            time.sleep(SAMPLE_SECONDS)

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
                raise RuntimeError(f"the pipeline exited ({self.proc.returncode}) before {what}; "
                                   f"see {self.log}")  # fmt: skip
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {what} within {timeout:.0f} s; see {self.log}")
            time.sleep(0.05)

    def kill(self) -> float:
        """SIGKILL the whole group, as a crash would; return when it was sent."""
        try:
            tree = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            tree = []
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
