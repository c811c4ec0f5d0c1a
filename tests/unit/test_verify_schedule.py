"""The harness's fault schedule: every point of every query, addressed to that query."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eos_connectors.core.faults import Entry
from eos_connectors.dev.harness.cells import (
    CELLS,
    DRIVER_POINTS,
    TASK_COMMIT,
    TWO_PHASE_POINTS,
    CustomSink,
    targets,
)
from eos_connectors.dev.harness.plan import PAIR_CROSSINGS, check_plan, step_entries
from eos_connectors.dev.harness.verify import (
    FAMILIES,
    MIXED_GROUP_CRASHES,
    Plan,
    VerifyError,
    schedule,
)

CUSTOM = CustomSink("my_sink", "my_pkg:counts", (), None)


def _entries(
    full_crashes: str, rounds: int = 1, master: str | None = None
) -> tuple[list[Entry], list[str]]:
    plan = Plan(
        cells=tuple(CELLS),
        custom=CUSTOM,
        full_crashes=full_crashes,
        fault_rounds=rounds,
        master=master,
        work_dir=Path("unused"),
    )
    chosen = targets(plan.cells, FAMILIES, "tag", (CUSTOM,), plan.on_cluster)
    return [Entry.parse(e) for e in schedule(plan, chosen)], [t.name for t in chosen]


def test_every_point_of_every_query_is_planned_once_per_round_in_its_own_query() -> None:
    entries, queries = _entries("mixed", rounds=2)
    chosen = {t.name: t for t in targets(tuple(CELLS), FAMILIES, "tag", (CUSTOM,))}
    assert len(queries) == 15 and "rc-custom" in queries and "bc-kafka-batch" in queries
    for name, target in chosen.items():
        mine = [e for e in entries if e.query == name and e.point != "source-read"]
        assert sorted(e.point for e in mine) == sorted(target.points * 2)
        assert len({e.batch for e in mine}) == len(mine), "one point per batch"
    assert [e.point for e in entries].count("source-read") == 1


def test_pairs_coverage_crosses_every_sink_and_point_in_fewer_batches() -> None:
    """CI's coverage: each built-in sink's points spread over its queries, every (sink,
    point) pair crossed (by ``PAIR_CROSSINGS`` queries), every query crossed, the custom
    sink and the records query's restart kept whole; a query then needs fewer batches."""
    every = Plan(cells=tuple(CELLS), custom=CUSTOM, records=4000, work_dir=Path("u"))
    pairs = Plan(**{**every.__dict__, "coverage": "pairs"})
    chosen = targets(every.cells, FAMILIES, "tag", (CUSTOM,))
    crossed = [Entry.parse(e) for e in schedule(pairs, chosen) if "source-read" not in e]
    by_family: dict[tuple[str, str], set[str]] = {}
    for target in chosen:
        mine = {e.point for e in crossed if e.query == target.name}
        assert mine, f"{target.name} is never crossed"
        for point in mine:
            by_family.setdefault((target.family, point), set()).add(target.name)
        if target.family == "custom":
            assert mine == set(target.points)
    for target in chosen:
        for point in target.points:
            alike = [t for t in chosen if (t.family, t.points) == (target.family, target.points)]
            assert len(by_family[(target.family, point)]) >= min(PAIR_CROSSINGS, len(alike))
    assert "after-commit" in pairs.points(chosen)["rec-kafka-records"]
    for crossing in ("cl-postgres-changes", "cl-redis-changes"):  # keys across tasks
        assert pairs.points(chosen)[crossing] == TWO_PHASE_POINTS, crossing
    batch_commit = [t.name for t in chosen if t.family == "kafka" and t.sink != TASK_COMMIT]
    assert len(batch_commit) == 4, batch_commit  # every Kafka query but the records cell's
    driver = {p for q in batch_commit for p in pairs.points(chosen)[q] if p in DRIVER_POINTS}
    assert driver == set(DRIVER_POINTS), "the Kafka sink's batch commit has the driver's points"
    assert len(crossed) < len(schedule(every, chosen)) * 3 // 4
    fewer = pairs.batch_offsets(chosen)
    assert fewer["rc-postgres"] > every.batch_offsets(chosen)["rc-postgres"], "no fewer batches"
    timed = {fewer[t.name] for t in chosen if t.cell.timed}
    assert timed == {pairs.timed_batch_offsets(chosen)}, "the event-time queries share one"


def test_a_mixed_plan_crashes_the_whole_pipeline_once_in_a_task() -> None:
    """And the records cell's query alone restarts after a task committed, with another
    minPartitions (see cells.py): a query restart, not a run of every query."""
    entries, _ = _entries("mixed")
    whole = [e for e in entries if e.action == "group"]
    assert len(whole) == MIXED_GROUP_CRASHES == 1
    assert whole[0].point == "after-prepare" and whole[0].point not in DRIVER_POINTS
    restarts = [e for e in entries if e.action == "restart"]
    assert [(e.query, e.point) for e in restarts] == [("rec-kafka-records", "after-commit")]


def test_all_makes_every_point_a_whole_pipeline_crash() -> None:
    entries, _ = _entries("all")
    assert {e.action for e in entries} == {"group"}


def test_on_a_cluster_each_query_gets_a_zombie_and_loses_an_executor_mid_write() -> None:
    entries, queries = _entries("mixed", master="spark://127.0.0.1:7077")
    for query in queries:
        mine = {e.point: e.action for e in entries if e.query == query}
        assert mine["before-prepare"] == "pause"
        assert mine["after-prepare"] in ("executor", "group")
        if "-kafka" not in query:
            assert mine["mid-prepare"] == "executor"
            assert not set(mine) & set(DRIVER_POINTS), "the cells cross those locally"
    whole = [e for e in entries if e.action == "group"]
    assert len(whole) <= MIXED_GROUP_CRASHES
    assert "source-read" not in {e.point for e in entries}, "the source's replay is local"
    everything, _ = _entries("all", master="spark://127.0.0.1:7077")
    assert {e.action for e in everything} == {"group", "pause"}


def test_only_failures_after_sink_code_ran_count_against_the_plan(tmp_path: Path) -> None:
    """A query that failed while initialising, or whose Python worker never started
    (Spark's 10 s connect-back on a busy machine), ran no sink code: the harness lets
    the pipeline restart it. Any other failure beyond the planned kills is a problem."""
    from eos_connectors.dev.harness.pipeline import EVENT_PREFIX
    from eos_connectors.dev.harness.report import Run
    from eos_connectors.dev.harness.runner import Runner

    def failed(query: str, error: str, **flags: bool) -> str:
        event = {"event": "query-failed", "query": query, "error": error, **flags}
        return EVENT_PREFIX + json.dumps(event)

    (tmp_path / "run-001.log").write_text(
        "\n".join(
            [
                failed("rc-postgres", "Python worker exited unexpectedly (crashed)."),
                failed("rc-postgres", "Python worker failed to connect back.", starved=True),
                failed("rc-redis", "Python worker failed to connect back.", initializing=True),
                failed("rc-kafka", "ProtocolError: unit vanished"),
            ]
        )
    )
    runner = Runner.__new__(Runner)
    runner.plan = Plan(cells=tuple(CELLS), work_dir=tmp_path)
    failures = runner._query_failures(1)
    assert failures == {"rc-postgres": 1, "rc-kafka": 1}
    run = Run(
        1,
        0,
        "finished",
        1.0,
        faults=["after-decision@2:rc-postgres=process"],
        query_failures=failures,
    )
    problems = runner._unplanned_failures([run])
    assert len(problems) == 1 and "rc-kafka" in problems[0] and "unit vanished" in problems[0]


def test_an_event_is_read_whatever_the_jvm_wedged_around_it() -> None:
    """The JVM logs to the same file as the pipeline's events; its text can land before
    an event or right after it on the same line."""
    from eos_connectors.dev.harness.pipeline import EVENT_PREFIX, parse_event

    event = EVENT_PREFIX + json.dumps({"event": "ready", "query": "rc-redis"})
    jvm = "26/11/23 00:50:22 WARN MicroBatchExecution: Disabling AQE"
    for line in (event, event + jvm, jvm + event, jvm + event + jvm):
        assert parse_event(line) == {"event": "ready", "query": "rc-redis"}
    assert parse_event(jvm) is None and parse_event(EVENT_PREFIX + "{broken") is None


def test_a_step_fault_holds_the_first_query_of_its_family_after_its_other_points() -> None:
    plan = Plan(
        cells=("running-count",),
        step_faults=("coordinator", "postgres", "redis"),
        work_dir=Path("unused"),
    )
    chosen = targets(plan.cells, FAMILIES, "tag")
    entries = [Entry.parse(e) for e in schedule(plan, chosen)]
    held = {e.query: e for e in entries if e.action == "hold"}
    assert {q: (e.point, e.partition) for q, e in held.items()} == {
        "rc-kafka": ("after-decision", None),  # the driver decided, before its EndTxn
        "rc-postgres": ("after-decision", None),  # the driver before its COMMIT PREPAREDs
        "rc-redis-increment": ("after-decision", None),  # staged and decided, not applied
    }
    for query, entry in held.items():
        others = [e.batch or 0 for e in entries if e.query == query and e.action != "hold"]
        assert entry.batch is not None and entry.batch > max(others)
        assert entry.batch < plan.batches_needed(max(len(t.points) for t in chosen))
    named = step_entries(plan, chosen)
    assert named[str(held["rc-kafka"])] == "coordinator"
    assert named[str(held["rc-postgres"])] == "postgres"


def test_two_step_faults_of_one_sink_hold_in_batches_of_their_own() -> None:
    plan = Plan(
        cells=("running-count",),
        sinks=("postgres",),
        step_faults=("postgres", "postgres-partition"),
        master="spark://127.0.0.1:7077",
        work_dir=Path("unused"),
    )
    chosen = targets(plan.cells, plan.sinks, "tag")
    named = step_entries(plan, chosen)
    held = {name: Entry.parse(entry) for entry, name in named.items()}
    assert (held["postgres"].point, held["postgres"].partition) == ("after-decision", None)
    partition = held["postgres-partition"]
    assert (partition.point, partition.partition) == ("after-prepare", 0)  # a task
    assert held["postgres-partition"].batch == (held["postgres"].batch or 0) + 1
    needed = plan.batches_needed(max(len(t.points) for t in chosen))
    assert all((e.batch or 0) < needed for e in held.values())
    check_plan(plan, lambda name, meanwhile=None: None)
    alone = Plan(**{**plan.__dict__, "step_faults": ("postgres-partition",)})
    check_plan(alone, None)  # a partition needs no stack of the package's own


def test_the_driver_partition_needs_a_cluster() -> None:
    plan = Plan(sinks=("postgres",), step_faults=("postgres-partition",), work_dir=Path("u"))
    with pytest.raises(VerifyError, match="needs a Spark standalone cluster"):
        check_plan(plan, None)


def test_a_step_fault_needs_a_sink_of_its_family() -> None:
    plan = Plan(sinks=("postgres",), step_faults=("redis",), work_dir=Path("unused"))
    with pytest.raises(VerifyError, match="--step-fault redis needs a redis sink"):
        check_plan(plan, lambda name, meanwhile=None: None)
    with pytest.raises(VerifyError, match="Unknown step fault 'broker'"):
        check_plan(Plan(step_faults=("broker",), work_dir=Path("unused")), None)


def test_checkpoints_on_a_shared_store_are_the_runs_own() -> None:
    first = Plan(work_dir=Path("verify"), checkpoint_root="hdfs://nn:8020/runs/")
    second = Plan(work_dir=Path("verify"), checkpoint_root="hdfs://nn:8020/runs/")
    assert first.checkpoints == first.checkpoints  # stable within a run
    assert first.checkpoints.startswith("hdfs://nn:8020/runs/verify-")
    assert first.checkpoints != second.checkpoints, "two runs would share checkpoints"
    assert Plan(work_dir=Path("w")).checkpoints == str(Path.cwd() / "w" / "checkpoint")


def test_a_batch_is_spared_for_random_faults_only_and_the_event_time_cell_has_four() -> None:
    """A spare batch when something may come at any moment (a kill, a broker's death, a
    network fault), none for a service restart; the event-time cell reads its input in
    at least four batches, so that some of its records are late whatever the batches."""
    base = Plan(cells=tuple(CELLS), records=4_000, kills=0, work_dir=Path("unused"))
    restarts = Plan(**{**base.__dict__, "restarts": ("redis",)})
    killed = Plan(**{**base.__dict__, "kills": 1})
    faulted = Plan(**{**base.__dict__, "network_faults": ("redis:cut",)})
    assert base.batches_needed(2) == restarts.batches_needed(2) == 2 + 2
    assert killed.batches_needed(2) == faulted.batches_needed(2) == 2 + 3
    chosen = targets(base.cells, FAMILIES, "tag", (CUSTOM,))
    assert restarts.timed_batch_offsets(chosen) <= 4_000 // 4
