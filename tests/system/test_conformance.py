"""The conformance cells on a real Spark pipeline: every fault point of every sink fires, in
the queries it is addressed to (each (sink, point) pair in at least one query:
``--coverage pairs``; ``make soak`` crosses every point of every query), Redis is
restarted, and every sink ends exact; in the same run, the
harness is shown to fail: three sinks that each break the protocol in one way
(``examples.sqlite_sink.broken``) must be reported in the column of what they break.

One harness run (``eos verify``) holds every query of the six cells (see
connectors/dev/harness/cells.py), the example SQLite sink of a connector author
(examples/sqlite_sink) and the broken sinks (one per column of the report: lost,
duplicated, leftovers; ``make soak`` runs all five in a run of their own), each
addressed by its own fault points. One point crashes the whole pipeline; kills at
random moments are make soak's (its ``eos verify`` runs and test_connect's soak case).
The changelog cell's PostgreSQL and Redis queries make one key's changes cross tasks
(split source partitions, then a round-robin shuffle): the harness fails the run unless
each layout was refused with nothing written, and they end exact after the fix, every
point of their sink crossed (issue 52).

Every Kafka query but the records cell's runs in the Kafka sink's default
``commitMode=batch`` and crosses the points of a two-phase sink, the driver's too, each
twice; the records cell runs in the fallback ``commitMode=task`` (issue 53).

Cost: ~165 s in CI (two runs of ~55 and ~100 s; ~195-220 s until Spark's jar left the
Python workers' import path, core/worker_path.py; a batch to spare per query, for
random faults this run plans none of, cost ~15 s; each (sink, point) pair crossed twice, by
queries of two cells, took ~20-35 s more; the broken sinks' run of their own took
91 s before they joined it; the crossing layouts and their every point added ~5 s, the
batch-commit cell ~15 s; the records query's restart with another minPartitions, a run
of every query of its own until it became a restart of that query alone, ~40 s).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from eos_connectors.core.faults import Entry
from eos_connectors.core.topics import read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness.cells import (
    CELLS,
    KAFKA_POINTS,
    TASK_COMMIT,
    TWO_PHASE_POINTS,
    late_records,
)
from eos_connectors.dev.harness.plan import PAIR_CROSSINGS
from eos_connectors.dev.harness.verify import MIXED_GROUP_CRASHES, CustomSink, Names, Report
from eos_connectors.dev.stack.kafka_tools import kafka_transactions, transaction_version
from examples.sqlite_sink import counts
from tests.system.broken_sinks import (
    CI_BROKEN,
    SHOWN_AT,
    broken_sinks,
    check_broken_sinks_were_reported,
)

pytestmark = [pytest.mark.services, pytest.mark.spark]

_SQLITE: dict[str, str] = {}


def read_sqlite() -> dict[str, int]:
    """The --sink-reader of the example sink: what its table holds."""
    return counts(_SQLITE["path"], "counts")


@pytest.mark.cost(170)
def test_every_cell_crosses_every_point_of_every_sink(
    endpoints: Endpoints, eos_verify: Callable[..., Report], tmp_path: Path
) -> None:
    # The local broker runs Kafka 4's default transaction protocol version 2 (the
    # replicated Kafka of test_distributed.py, version 1).
    assert transaction_version(endpoints.kafka_bootstrap) == 2
    _SQLITE["path"] = str(tmp_path / "example-sink.db")
    options = (
        ("path", _SQLITE["path"]),
        ("table", "counts"),
        ("keyColumn", "word"),
        ("valueColumn", "count"),
        ("mode", "upsert"),
    )
    custom = CustomSink(
        "eos_sqlite", f"{__name__}:read_sqlite", options, "examples.sqlite_sink:SqliteDataSource"
    )
    broken = broken_sinks(tmp_path, CI_BROKEN)
    report = eos_verify(
        records=4_000,
        cells=tuple(CELLS),
        custom=custom,
        customs=broken,
        kills=0,
        restarts=("redis",),
        coverage="pairs",
    )
    print(report.table(), report.fault_table(), sep="\n")
    assert not report.problems, report.problems
    check_broken_sinks_were_reported(report, CI_BROKEN)
    sound = [s for s in report.sinks if not s.sink.startswith("rc-custom-")]
    assert all(s.ok for s in sound), (report.table(), [s.leftovers for s in sound])

    queries = {s.sink for s in sound}
    assert queries == {f"{c.short}-{sink}" for c in CELLS.values() for sink, _ in c.sinks} | {
        "rc-custom"
    }
    # Every point of every sink fired, in the query it was addressed to.
    schedule = report.plan["schedule"]
    assert set(report.fired) == set(schedule), "a planned fault point never fired"
    for entry, where in report.fired.items():
        assert where["query"] == Entry.parse(entry).query, f"{entry} fired in {where}"
    _check_every_sink_and_point_is_crossed(schedule, queries)
    whole = [e for e in schedule if Entry.parse(e).action == "group"]
    assert len(whole) == MIXED_GROUP_CRASHES, whole
    # The records query alone was stopped after a task of its batch committed, and
    # started again with another minPartitions, in the same run.
    restarts = [e for e in schedule if Entry.parse(e).action == "restart"]
    assert [Entry.parse(e).query for e in restarts] == ["rec-kafka-records"], restarts
    changed = _min_partitions(report)
    assert len(set(changed)) > 1, f"minPartitions never changed between starts: {changed}"
    assert report.run_of(restarts[0]) in _restarted_in(report), "no restart of its own"
    # The run the group point ended was a crash, plus the Redis crash.
    assert report.crashes >= len({report.run_of(e) for e in whole}) + 1
    assert all(s.expected > 1_000 for s in sound)

    # The event-time cell's input had records that are late however the batches fall
    # (the sinks matched an expectation without them), and its tail.
    timed = read_to_end(endpoints.kafka, Names(_tag(report)).timed)
    assert late_records(timed, report.plan["timed_batch_offsets"]) > 20
    _check_kafka_finds_nothing_open(endpoints, _tag(report))


def _check_kafka_finds_nothing_open(endpoints: Endpoints, tag: str) -> None:
    """After every crash of the run, Kafka's own tooling (``kafka-transactions.sh``)
    lists no transaction of the run's sinks still open and finds none hanging."""
    from confluent_kafka.admin import AdminClient

    listed = kafka_transactions(endpoints.kafka_bootstrap, "list")
    ours = [line for line in listed.splitlines() if f"verify-{tag}-" in line]
    assert ours, f"kafka-transactions list shows none of the run's ids:\n{listed[:2000]}"
    still_open = [line for line in ours if "Ongoing" in line or "Prepare" in line]
    assert not still_open, still_open
    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    for broker in admin.list_topics(timeout=10).brokers:
        hanging = kafka_transactions(
            endpoints.kafka_bootstrap, "find-hanging", "--broker-id", str(broker)
        )
        rows = [line for line in hanging.splitlines()[1:] if line.strip()]
        assert not rows, f"kafka-transactions find-hanging on broker {broker}:\n{hanging}"


def _check_every_sink_and_point_is_crossed(schedule: list[str], queries: set[str]) -> None:
    """CI's coverage ("pairs"): every (sink, fault point) pair crossed, by
    ``PAIR_CROSSINGS`` queries where the sink has that many (each query of a built-in sink
    crosses some of its points);
    every query crossed at least once; the example sink at every point, each broken sink
    at the points that show its flaw."""
    crossed = {(Entry.parse(e).query, Entry.parse(e).point) for e in schedule}
    family = {q: q.split("-")[1] for q in queries}
    task_commit = f"rec-{TASK_COMMIT}"  # the Kafka sink's fallback mode: the tasks commit
    kinds = {
        "kafka": (
            [q for q in queries if family[q] == "kafka" and q != task_commit],
            TWO_PHASE_POINTS,
        ),
        "kafka task commit": ([task_commit], KAFKA_POINTS),
        "postgres": ([q for q in queries if family[q] == "postgres"], TWO_PHASE_POINTS),
        "redis": ([q for q in queries if family[q] == "redis"], TWO_PHASE_POINTS),
    }
    for sink, (mine, points) in kinds.items():
        for point in points:
            by = [q for q in mine if (q, point) in crossed]
            assert len(by) >= min(PAIR_CROSSINGS, len(mine)), f"({sink}, {point}): {by}"
    for query in queries:
        assert any(q == query for q, _ in crossed), f"{query} was never crossed"
    assert {("rc-custom", p) for p in TWO_PHASE_POINTS} <= crossed, "the example sink missed one"
    for kind in CI_BROKEN:
        shown = {(f"rc-custom-{kind}", p) for p in SHOWN_AT[kind]}
        assert shown <= crossed, f"the sink broken at {kind} missed what shows it"


def _min_partitions(report: Report) -> list[int]:
    """The records cell's minPartitions at each start, from the runs' event lines."""
    from eos_connectors.dev.harness.pipeline import parse_event

    found = []
    for log in sorted(Path(report.plan["work_dir"]).glob("run-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            event = parse_event(line)
            if event is not None and event.get("event") == "min-partitions":
                found.append(int(event["min_partitions"]))
    return found


def _restarted_in(report: Report) -> set[int]:
    """The runs in which the pipeline stopped the records query and started it again."""
    from eos_connectors.dev.harness.pipeline import parse_event

    runs = set()
    for log in sorted(Path(report.plan["work_dir"]).glob("run-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            event = parse_event(line)
            if event is not None and event.get("event") == "query-stopping":
                runs.add(int(log.stem.split("-")[1]))
    return runs


def _tag(report: Report) -> str:
    spec = (Path(report.plan["work_dir"]) / "pipeline.json").read_text()
    return spec.split("verify-in-timed-", 1)[1].split('"', 1)[0]
