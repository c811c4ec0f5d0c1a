"""``eos verify``: crash a real pipeline at every fault point of every sink, then count.

The harness writes transactional input (every fourth transaction aborted; for the
event-time cell with out-of-order and late timestamps) and knows what each sink
must end up holding; runs one pipeline process (``eos_connectors.dev.harness.pipeline``)
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

import sys
import uuid
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any, TextIO

from eos_connectors.core import faults
from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness import checks
from eos_connectors.dev.harness.cells import CELLS, CustomSink, Target, targets, window_counts
from eos_connectors.dev.harness.data import (
    final_state,
    produce_changes,
    produce_timed_words,
    produce_words,
)
from eos_connectors.dev.harness.network import NetworkFaults
from eos_connectors.dev.harness.plan import (
    BROKER_ROLES,
    DRIVER_PARTITION,
    FAMILIES,
    MIXED_GROUP_CRASHES,
    SERVICES,
    STEP_FAULTS,
    CrashService,
    Names,
    Plan,
    VerifyError,
    check_plan,
    schedule,
)
from eos_connectors.dev.harness.report import Report, Run
from eos_connectors.dev.harness.runner import Runner

__all__ = [
    "BROKER_ROLES",
    "CELLS",
    "FAMILIES",
    "MIXED_GROUP_CRASHES",
    "SERVICES",
    "STEP_FAULTS",
    "CustomSink",
    "Names",
    "Plan",
    "Report",
    "Run",
    "VerifyError",
    "schedule",
    "verify",
]


def verify(
    plan: Plan,
    endpoints: Endpoints,
    out: TextIO = sys.stderr,
    crash_service: CrashService | None = None,
) -> Report:
    """Run ``plan`` against real services; the report says what each sink holds."""
    check_plan(plan, crash_service)
    from eos_connectors.dev.warm_up import ensure_class_archive

    names = Names(uuid.uuid4().hex[:10])
    chosen = targets(plan.cells, plan.sinks, names.tag, plan.custom_sinks, plan.on_cluster)
    plan.work_dir.mkdir(parents=True, exist_ok=True)
    expected_words = _write_input(plan, endpoints, names, chosen, out)
    for target in chosen:
        if target.family == "kafka":
            create_topic(endpoints.kafka, target.output, 2, **_output_config(target))
    ensure_class_archive()
    entries = schedule(plan, chosen)
    network, piped = None, endpoints
    apart = DRIVER_PARTITION in plan.step_faults
    faulted = [f.partition(":")[0] for f in plan.network_faults] + (["postgres"] if apart else [])
    services = tuple(dict.fromkeys(faulted))
    if services:  # the pipeline goes through the proxies, the checks straight to the services
        network, piped = NetworkFaults.start(
            plan.work_dir / "toxiproxy", endpoints, services, driver_apart=apart
        )
    try:
        runner = Runner(plan, piped, names, chosen, entries, out, crash_service, network)
        runs, problems = runner.run_to_the_end()
    finally:
        if network is not None:
            network.stop()
    results = []
    if not problems:
        results = _check_sinks(plan, endpoints, names, chosen, expected_words)
    fired = faults.fired(runner.markers)
    shown = {
        **asdict(plan),
        "custom": plan.custom.public() if plan.custom else None,
        "customs": [c.public() for c in plan.customs],
        "batch_offsets": plan.batch_offsets(chosen),
        "timed_batch_offsets": plan.timed_batch_offsets(chosen),
        "checkpoints": plan.checkpoints,
    }
    report = Report({**shown, "schedule": entries}, runs, results, problems, fired)
    (plan.work_dir / "report.json").write_text(report.to_json())
    return report


def _output_config(target: Target) -> dict[str, str]:
    """A change stream's output topic is compacted, as one kept in step with a table is;
    its segments roll weekly (the default), so every record stays readable for the
    duplicate check while the run lasts."""
    return {"cleanup.policy": "compact"} if target.sink == "kafka-changes" else {}


def _write_input(
    plan: Plan, endpoints: Endpoints, names: Names, chosen: list[Target], out: TextIO
) -> Counter[str]:
    vocabulary = tuple(f"w{i:05d}" for i in range(plan.words))
    bootstrap = endpoints.kafka_bootstrap
    print(
        f"Writing {plan.records:,} records per input (every 4th transaction aborted)...",
        file=out,
        flush=True,
    )
    expected: Counter[str] = Counter()
    if any(t.cell.input == "changes" for t in chosen):
        create_topic(plaintext(bootstrap), names.changes, plan.partitions)
        produce_changes(bootstrap, names.changes, plan.records, plan.seed, vocabulary)
    if any(t.cell.input == "words" for t in chosen):
        create_topic(plaintext(bootstrap), names.words, plan.partitions)
        expected = produce_words(bootstrap, names.words, plan.records, plan.seed, vocabulary)
    if any(t.cell.timed for t in chosen):
        # One partition, so that what is late follows from the input's order (see
        # data.produce_timed_words). Event times lie in the past: keep the records
        # whatever their age (retention deletes by timestamp).
        create_topic(plaintext(bootstrap), names.timed, 1, **{"retention.ms": "-1"})
        batch = plan.timed_batch_offsets(chosen)
        produce_timed_words(bootstrap, names.timed, plan.records, batch, plan.seed, vocabulary)
    return expected


def _check_sinks(
    plan: Plan,
    endpoints: Endpoints,
    names: Names,
    chosen: list[Target],
    words: Counter[str],
) -> list[checks.SinkResult]:
    timed: list[Any] = []
    if any(t.cell.timed for t in chosen):
        timed = read_to_end(endpoints.kafka, names.timed)
    changes: dict[str, int] = {}
    if any(t.cell.input == "changes" for t in chosen):
        ordered = sorted(read_to_end(endpoints.kafka, names.changes))
        changes = final_state((r.key, r.value) for r in ordered)
    results = []
    for target in chosen:
        expected: Mapping[str, int] = words
        if target.cell.timed:
            expected = window_counts(timed, plan.timed_batch_offsets(chosen))
        elif target.cell.input == "changes":
            expected = changes
        observed = target.observed(endpoints, plan.custom_sinks)
        results.append(checks.compare(target.name, expected, observed))
    return results
