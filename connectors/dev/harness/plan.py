"""What a harness run does: the plan (input, cells, sinks, faults) and its fault schedule."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from eos_connectors.core import faults
from eos_connectors.core.errors import EosError
from eos_connectors.dev.harness.cells import (
    CELLS,
    CROSSING_SINKS,
    DRIVER_POINTS,
    TASK_COMMIT,
    TWO_PHASE_POINTS,
    Cell,
    CustomSink,
    Target,
    targets,
)
from eos_connectors.dev.harness.network import NETWORK_KINDS, NETWORK_SERVICES, parse_fault

FAMILIES = ("kafka", "postgres", "redis")
SERVICES = ("kafka", "postgres", "redis")
#: Brokers of a replicated Kafka to SIGKILL and start again mid-run, by what they do for
#: the run: lead partition 0 of an input topic, lead partition 0 of a Kafka sink's output
#: topic, coordinate a Kafka sink's task partition 0's transactions. The query must not
#: fail: with replication 3 another broker takes over. ``min-isr``: the output leader and
#: one more broker down together for a while (one replica left, below
#: min.insync.replicas, and the controller quorum lost): the query waits or fails and
#: replays, and never writes past it.
BROKER_ROLES = ("input-leader", "output-leader", "coordinator", "min-isr")
#: Service faults at one protocol step (``--step-fault NAME``): the first query into a
#: sink of the family holds at the point (:data:`faults.WAITING`), the harness crashes
#: the service, and the query goes on into the next step, which meets the fault.
#: ``coordinator``: the driver of a Kafka query in the batch commit has decided a batch
#: and ended none of its transactions: the coordinator of task partition 0's
#: transactional id is SIGKILLed, and the driver commits while it is down (a replicated
#: Kafka; the query must not fail). ``postgres``: the driver has
#: decided the batch and sent no COMMIT PREPARED; ``redis``: the tasks staged, the driver
#: decided and applied nothing: the store is SIGKILLed and started again first.
#: ``postgres-partition`` (a Spark standalone cluster): a task has prepared (task
#: partition 0), and the driver alone is cut off PostgreSQL for a while
#: (:mod:`.network`) as the batch's tasks finish: its claim, decision and commits meet it.
STEP_FAULTS: dict[str, tuple[str, str]] = {
    "coordinator": ("kafka", "after-decision"),
    "postgres": ("postgres", "after-decision"),
    "redis": ("redis", "after-decision"),
    "postgres-partition": ("postgres", "after-prepare"),
}
DRIVER_PARTITION = "postgres-partition"


class CrashService(Protocol):
    """SIGKILLs a service of the stack (or nodes ``kafka-1,kafka-2``) and starts it again;
    ``meanwhile`` runs while it is down."""

    def __call__(self, name: str, meanwhile: Callable[[], None] | None = None) -> None: ...


class VerifyError(EosError):
    """The harness could not run the pipeline to the end (the message says why)."""


@dataclass(frozen=True)
class Plan:
    records: int = 20_000
    cells: tuple[str, ...] = ("running-count",)
    sinks: tuple[str, ...] = FAMILIES  # which sink families of each cell
    custom: CustomSink | None = None
    customs: tuple[CustomSink, ...] = ()  # more custom sinks, each with its own name
    fault_rounds: int = 1  # each point of each sink fires this many times
    kills: int = 1  # SIGKILLs of the whole pipeline at random moments
    restarts: tuple[str, ...] = ()  # services to SIGKILL and start again mid-run
    broker_kills: tuple[str, ...] = ()  # BROKER_ROLES: brokers to SIGKILL and restart
    network_faults: tuple[str, ...] = ()  # "service:kind" (see harness.network), mid-run
    step_faults: tuple[str, ...] = ()  # STEP_FAULTS: a service crashed at a protocol step
    full_crashes: str = "mixed"  # "mixed": GROUP_POINTS as group crashes; "all"; "none"
    #: "every": each query crosses every point of its sink; "pairs": the points of each
    #: built-in sink are spread over its queries, each point crossed by at least one
    #: (see :meth:`points`); a custom sink always crosses every point
    coverage: str = "every"
    partitions: int = 2  # of each input topic
    shuffle_partitions: int = 2  # units per batch of a stateful query's sink
    words: int = 40
    seed: int = 7
    stall_timeout: float = 240.0
    master: str | None = None  # a Spark master URL; default local mode
    work_dir: Path = field(default_factory=lambda: Path("verify-runs") / uuid.uuid4().hex[:8])
    checkpoint_root: str | None = None  # a URI (hdfs://...): checkpoints there, not in work_dir
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def __post_init__(self) -> None:
        # Absolute: the fault markers' directory goes to every Python worker, and on a
        # standalone cluster a worker's working directory is its executor's own folder
        # under the Spark worker's, so a relative one named another folder per executor:
        # an entry that fired in one executor fired again in the next, and the harness
        # never saw any of them fire (`eos verify --master spark://...` from its default
        # verify-runs/<id>).
        object.__setattr__(self, "work_dir", self.work_dir.absolute())

    @property
    def checkpoints(self) -> str:
        """Where the queries checkpoint (``<this>/<query name>``): under ``checkpoint_root``
        in a folder of this run's own (a work dir's name may repeat: a test's is always
        ``verify``, and a query must never start from another run's checkpoint), else the
        work dir's ``checkpoint``."""
        if self.checkpoint_root:
            return f"{self.checkpoint_root.rstrip('/')}/{self.work_dir.name}-{self.run_id}"
        return str(self.work_dir / "checkpoint")

    @property
    def custom_sinks(self) -> tuple[CustomSink, ...]:
        """``custom`` and ``customs`` together."""
        return (self.custom, *self.customs) if self.custom is not None else self.customs

    @property
    def on_cluster(self) -> bool:
        return self.master is not None and self.master.startswith("spark://")

    def batches_needed(self, points_per_query: int) -> int:
        """Batch 0, then each query's own points one batch apart from batch 1, the source's
        point, a batch to spare when random kills, broker kills or network faults are
        planned (they come at any moment, whatever the batch, and each broker fault waits
        for progress), and a batch for each step fault of one sink family after those.
        A service restart needs no spare: it comes within 3 s of a run's first progress,
        and a run it misses carries it to the next (CI's conformance run: 88 batches in
        all instead of 103)."""
        by_family = Counter(STEP_FAULTS[f][0] for f in self.step_faults if f in STEP_FAULTS)
        spare = 1 if self.kills or self.broker_kills or self.network_faults else 0
        steps = max(by_family.values(), default=0)
        return points_per_query * self.fault_rounds + 2 + spare + steps

    def points(self, chosen: list[Target]) -> dict[str, tuple[str, ...]]:
        """Query -> the fault points it crosses. With ``coverage="every"`` each query crosses
        every point of its sink. With ``"pairs"`` (CI's budget) the points of each built-in
        sink family are spread over its queries in turn, so that every (sink, point) pair is
        still crossed (:data:`PAIR_CROSSINGS` times where the family has that many queries;
        queries of one family with other points, the Kafka sink's batch commit, are spread
        apart), and each query crosses at least one; fewer points a query means fewer
        batches and fewer restarts of it. On a cluster, ``"pairs"`` crosses what only a
        cluster shows (:data:`CLUSTER_PAIR_POINTS`): each lost executor costs a new
        executor's start and the stages that lost their shuffle output. A query keeps the
        points it must cross (the records query's ``after-commit``, its restart with another
        ``minPartitions``), and a custom sink crosses every point (a connector author's sink
        is proven in full) unless it names its own (``CustomSink.points``: a sink shown to
        fail crosses those that show its flaw)."""
        if self.coverage == "every":
            return {t.name: t.points for t in chosen}
        if self.on_cluster:
            return {t.name: _on_a_cluster(t) for t in chosen}
        assigned: dict[str, tuple[str, ...]] = {}
        families: dict[tuple[str, tuple[str, ...]], list[Target]] = {}
        for target in chosen:
            if target.family == "custom":
                custom = target.custom_of(self.custom_sinks)
                chosen_points = custom.points if custom is not None else ()
                assigned[target.name] = tuple(p for p in target.points if p in chosen_points)
                assigned[target.name] = assigned[target.name] or target.points
            else:
                families.setdefault((target.family, target.points), []).append(target)
        for members in families.values():
            assigned |= _spread(members)
        return {t.name: assigned[t.name] for t in chosen}

    def batch_offsets(self, chosen: list[Target]) -> dict[str, int]:
        """Query -> its ``maxOffsetsPerTrigger``: enough batches for its points. The
        queries of the event-time cell share one (their input is written for it)."""
        points = self.points(chosen)
        offsets = {
            name: max(10, self.records // self.batches_needed(len(crossed)))
            for name, crossed in points.items()
        }
        timed = [t.name for t in chosen if t.cell.timed]
        if timed:
            shared = min(min(offsets[name] for name in timed), self.records // TIMED_BATCHES)
            offsets |= dict.fromkeys(timed, max(10, shared))
        return offsets

    def timed_batch_offsets(self, chosen: list[Target]) -> int:
        """The most offsets a batch of the event-time cell reads (its input and its
        expected windows follow from it)."""
        timed = [t.name for t in chosen if t.cell.timed]
        return self.batch_offsets(chosen)[timed[0]] if timed else 0


#: The fewest batches the event-time cell reads its input in: a record is late whatever
#: the batches only two batches' offsets after a record that closes its window
#: (``cells.late_records``), so with three batches of 4,000 records none was.
TIMED_BATCHES = 4

#: With ``coverage="pairs"`` on a cluster, what the local cells cannot cross: a zombie for
#: every sink (before-prepare: its executor dies, Spark resubmits the stages whose shuffle
#: output it held, and the zombie wakes after its batch was decided, the latest an
#: orphaned writer can come); the local cells cross every other point as a killed
#: process. An executor lost while its task writes (mid-prepare) is ``coverage="every"``'s
#: (``make soak``): in CI its two lost executors took the cluster run from 125 s to 164 s
#: and proved what a zombie and a killed process mid-prepare prove.
CLUSTER_PAIR_POINTS = {"kafka": ("before-prepare",), "two-phase": ("before-prepare",)}


def _on_a_cluster(target: Target) -> tuple[str, ...]:
    if target.family == "custom":
        return target.points
    return CLUSTER_PAIR_POINTS["kafka" if target.family == "kafka" else "two-phase"]


#: Where a (sink, point) pair is crossed this many times when a family has the queries.
#: Once: the second crossing, by a query of another cell, was repetition that CI's budget
#: cannot hold (the conformance run went from 231-254 s to 220 s); ``make soak`` crosses
#: every point in every query (``coverage="every"``).
PAIR_CROSSINGS = 1
#: Points a query of a kind must cross whatever the spread (the records query's restart
#: with another minPartitions happens at its after-commit).
#: The crossing queries cross every point of their sink (issue 52's conformance cell).
REQUIRED_POINTS = {
    TASK_COMMIT: ("after-commit",),
    **dict.fromkeys(CROSSING_SINKS, TWO_PHASE_POINTS),
}


def _spread(members: list[Target]) -> dict[str, tuple[str, ...]]:
    """The family's points over its queries in turn: query i takes the next ``each``
    points of the cycle, so that every point is crossed ``min(PAIR_CROSSINGS, queries)``
    times."""
    points = members[0].points
    crossings = min(PAIR_CROSSINGS, len(members))
    each = max(1, -(-len(points) * crossings // len(members)))
    assigned = {}
    for i, target in enumerate(members):
        mine = [points[(i * each + j) % len(points)] for j in range(min(each, len(points)))]
        mine += [p for p in REQUIRED_POINTS.get(target.sink, ()) if p not in mine]
        assigned[target.name] = tuple(p for p in points if p in mine)
    return assigned


class Names:
    """Topics of one harness run (sink outputs are named by ``cells.Target``)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.words = f"verify-in-{tag}"
        self.timed = f"verify-in-timed-{tag}"
        self.changes = f"verify-in-changes-{tag}"

    def topic(self, cell: Cell) -> str:
        """The input topic of ``cell``."""
        return {"timed": self.timed, "changes": self.changes}.get(cell.input, self.words)


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
    """Each query's points (:meth:`Plan.points`), one per batch from batch 1, and the
    source's point once, each with its query's action (:meth:`Target.action`), except the
    :data:`GROUP_POINTS` crashes of the whole pipeline; with ``full_crashes="all"``
    every point is one."""
    entries: list[str] = []
    crashed: list[str] = []  # families that have their whole-pipeline crash
    crossed = plan.points(chosen)
    for target in chosen:
        for text in faults.schedule(crossed[target.name], plan.fault_rounds, query=target.name):
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
    # tests/system/test_source_replay.py); on a cluster it would cost one more lost
    # executor and resubmitted stage and prove nothing about the sinks.
    if plan.fault_rounds and not plan.on_cluster:
        batch = len(crossed[first.name]) * plan.fault_rounds + 1
        action = "group" if plan.full_crashes == "all" else first.action("source-read")
        entries.append(str(faults.Entry("source-read", batch, first.name, action)))
    return entries + list(step_entries(plan, chosen))


def step_entries(plan: Plan, chosen: list[Target]) -> dict[str, str]:
    """A ``hold`` entry per step fault (and the fault it is for), in the first query into
    a sink of its family, in the batches after that query's other points and the
    source's: one batch each."""
    entries: dict[str, str] = {}
    taken: Counter[str] = Counter()
    crossed = plan.points(chosen)
    for name in plan.step_faults:
        point = STEP_FAULTS[name][1]
        target = step_target(name, chosen)
        batch = len(crossed[target.name]) * plan.fault_rounds + 2 + taken[target.name]
        taken[target.name] += 1
        partition = 0 if point not in DRIVER_POINTS else None
        entries[str(faults.Entry(point, batch, target.name, "hold", partition))] = name
    return entries


def step_target(name: str, chosen: list[Target]) -> Target:
    """The query a step fault holds: the first into a sink of its family that has its
    point (the Kafka sink's fallback ``commitMode=task`` has no driver's point)."""
    family, point = STEP_FAULTS[name]
    return next(t for t in chosen if t.family == family and t.reaches(point))


def check_plan(plan: Plan, crash_service: CrashService | None) -> None:
    """The plan against itself (:func:`check_names`) and against the services it got."""
    check_names(plan)
    crashes = [f for f in plan.step_faults if f != DRIVER_PARTITION]
    if (plan.restarts or plan.broker_kills or crashes) and crash_service is None:
        raise VerifyError(
            "Service restarts need the package's own stack (`eos stack up`), not endpoints "
            "from EOS_* variables."
        )


def check_connect_release(plan: Plan) -> None:
    """Over Spark Connect, the running-count cell (and the custom sinks, which join it)
    needs PySpark 4.1+: 4.0's Connect client has no ``transformWithStateInPandas``."""
    from eos_connectors.ops.session import is_connect

    if not is_connect(plan.master) or ("running-count" not in plan.cells and not plan.custom_sinks):
        return
    from eos_connectors.core.spark_api import SPARK_MINOR, release

    if SPARK_MINOR < (4, 1):
        raise VerifyError(
            f"The running-count cell (and a sink of your own, which joins it) uses "
            f"transformWithStateInPandas, which Spark Connect offers from PySpark 4.1; this "
            f"is {release()}. Over Connect, pick other cells (--cells aggregate,event-time) "
            "or run in a classic session (no --master connect)."
        )


def check_names(plan: Plan) -> None:
    """What the plan names (cells, sinks, services, faults) exists: checked before any
    service is started for it."""
    unknown = [c for c in plan.cells if c not in CELLS]
    if unknown:
        raise VerifyError(f"Unknown cell {unknown[0]!r}: cells are {', '.join(CELLS)}.")
    check_connect_release(plan)
    bad_sinks = [s for s in plan.sinks if s not in FAMILIES]
    if bad_sinks:
        raise VerifyError(
            f"Unknown sink {bad_sinks[0]!r}: built-in sinks are {', '.join(FAMILIES)}; "
            "name your own with --sink-format (and --sink-reader)."
        )
    names = [c.sink for c in plan.custom_sinks]
    if len(set(names)) < len(names):
        raise VerifyError(f"Custom sinks need names of their own: {sorted(names)}.")
    if not plan.sinks and not plan.custom_sinks:
        raise VerifyError("No sink to verify: name at least one.")
    bad = [s for s in plan.restarts if s not in SERVICES]
    if bad:
        raise VerifyError(f"Cannot restart {bad[0]!r}: services are {', '.join(SERVICES)}.")
    bad = [r for r in plan.broker_kills if r not in BROKER_ROLES]
    if bad:
        raise VerifyError(
            f"Cannot kill the {bad[0]!r} broker: roles are {', '.join(BROKER_ROLES)}."
        )
    bad = [f for f in plan.network_faults if parse_fault(f) is None]
    if bad:
        raise VerifyError(
            f"Unknown network fault {bad[0]!r}: SERVICE:KIND with SERVICE one of "
            f"{', '.join(NETWORK_SERVICES)} and KIND one of {', '.join(NETWORK_KINDS)}."
        )
    bad = [f for f in plan.step_faults if f not in STEP_FAULTS]
    if bad:
        raise VerifyError(f"Unknown step fault {bad[0]!r}: one of {', '.join(STEP_FAULTS)}.")
    families = {t.family for t in targets(plan.cells, plan.sinks, "check", (), False)}
    missing = [f for f in plan.step_faults if STEP_FAULTS[f][0] not in families]
    if missing:
        raise VerifyError(
            f"--step-fault {missing[0]} needs a {STEP_FAULTS[missing[0]][0]} sink in the run: "
            "add it to --sinks."
        )
    if DRIVER_PARTITION in plan.step_faults and not plan.on_cluster:
        raise VerifyError(
            f"--step-fault {DRIVER_PARTITION} needs a Spark standalone cluster "
            "(--master spark://...): in local mode the tasks run under the driver's "
            "process, so the driver cannot be cut off PostgreSQL alone."
        )
    if plan.full_crashes not in ("mixed", "all", "none"):
        raise VerifyError(f"full_crashes={plan.full_crashes!r}: choose 'mixed', 'all' or 'none'.")
    if plan.coverage not in ("every", "pairs"):
        raise VerifyError(f"coverage={plan.coverage!r}: choose 'every' or 'pairs'.")
    if plan.records < plan.batches_needed(4) * 50:
        raise VerifyError(
            f"{plan.records} records are too few for {plan.batches_needed(4)} batches of at "
            "least 50 records: raise --records or lower the crash counts."
        )
