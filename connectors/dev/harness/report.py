"""What a harness run found: each run of the pipeline, each sink's counts, the problems."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from eos_connectors.dev.harness import checks


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
        width = max([18, *(len(s.sink) for s in self.sinks)])
        head = f"| {'sink':<{width}} | {'expected':>9} | {'lost':>5} | {'duplicated':>10} "
        head += f"| {'wrong':>5} | {'leftovers':>9} | {'verdict':<7} |"
        lines = [head, "|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|"]
        for s in self.sinks:
            lines.append(
                f"| {s.sink:<{width}} | {s.expected:>9,} | {s.lost:>5} | {s.duplicated:>10} "
                f"| {s.wrong:>5} | {len(s.leftovers):>9} | {'OK' if s.ok else 'FAIL':<7} |"
            )
        return "\n".join(lines)

    def run_of(self, entry: str) -> int | None:
        """The run in which a planned point fired (None: it never did)."""
        return next((run.number for run in self.runs if entry in run.faults), None)

    def fault_table(self) -> str:
        """Every planned point and where it fired: query, batch, role, run."""
        lines = ["| planned point | fired in query | batch | role | run |", "|---|---|--:|---|--:|"]
        for entry in self.plan["schedule"]:
            where = self.fired.get(entry)
            if where is None:
                lines.append(f"| {entry} | **never fired** | | | |")
            else:
                lines.append(
                    f"| {entry} | {where.get('query')} | {where.get('batch')} "
                    f"| {where.get('role')} | {self.run_of(entry) or ''} |"
                )
        return "\n".join(lines)
