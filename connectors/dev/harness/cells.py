"""The conformance cells: which stages feed which sinks, and what each sink must end up holding.

A *cell* is one kind of stateful pipeline crossed with every sink that fits it:

* ``running-count`` (a): ``transformWithStateInPandas`` running count per word ->
  ``eos_kafka``, ``eos_postgres`` upsert, ``eos_redis`` increment (of each batch's delta);
* ``aggregate`` (b): ``groupBy().count()`` in complete mode -> ``eos_postgres`` upsert,
  ``eos_redis`` upsert; and every record -> ``eos_postgres`` append;
* ``event-time`` (c): a 10-second tumbling-window count over the Kafka ``timestamp``
  with a 5-second watermark, append mode, from input with out-of-order and late
  records -> ``eos_kafka``, ``eos_postgres`` upsert, ``eos_redis`` upsert;
* ``records`` (d): every record straight from the source into ``eos_kafka`` in its
  fallback mode, ``commitMode=task`` (each task commits its own transaction), no
  shuffle, so the source's split of a batch into tasks is the sink's task partitions,
  and ``minPartitions`` changes on every start of the query: a batch replayed after
  it failed between two tasks' commits must be split as it first was (the split is in
  its offset), or a task partition's marker speaks of other records. Its after-commit
  point restarts the query alone (``restart``: an operator stops it, changes the option
  and starts it again), not the whole pipeline, which costs a run of every query;
* ``batch-commit`` (f): the same records cell in the Kafka sink's default mode,
  ``commitMode=batch`` (tasks leave their transactions open, the driver commits them),
  each input record's ``partition:offset`` checked to be there once and no transaction
  left open. Every Kafka query but the records cell's runs in this mode and crosses
  every point of a two-phase sink, the driver's too;
* ``changelog`` (e): a change stream (inserts, updates, deletes, re-inserts, many
  changes of one key in one batch; see ``data.produce_changes``) kept in step in
  ``eos_postgres`` upsert with deletes, ``eos_redis`` upsert with deletes and
  ``eos_kafka`` with tombstones (read to its final state), each ordered by
  ``partition, offset``: the final state follows from the committed input alone. Its
  PostgreSQL and Redis queries read each input partition in two pieces and start with a
  round-robin shuffle, so one key's changes cross tasks of a batch: each layout must be
  refused before anything is written, and the fix the refusal names (a shuffle by the
  key) must end exact from the batch's recorded split (see ``layouts.py``); they cross
  every fault point of their sink.

Each (cell, sink) pair is one streaming query of one pipeline process, named
``<cell short name>-<sink>`` (``rc-kafka``): fault points are addressed to it by
that name. A connector author's sink joins the running-count cell as ``rc-custom``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

from eos_connectors.core.errors import EosError
from eos_connectors.core.secrets import redact_options
from eos_connectors.core.topics import Record
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness import checks, load
from eos_connectors.dev.harness.layouts import LAYOUTS
from eos_connectors.dev.harness.spec import WATERMARK_SECONDS, WINDOW_SECONDS, QuerySpec

#: Fault points of each kind of sink, in protocol order.
TWO_PHASE_POINTS = ("after-prepare", "after-decision", "between-commits", "after-commit")
KAFKA_POINTS = ("after-prepare", "after-commit")
DRIVER_POINTS = ("after-decision", "between-commits", "after-commit")
#: The ``records`` cell's ``minPartitions`` on the query's first, second, ... start.
VARIED_MIN_PARTITIONS = (2, 6, 4)  # 2, 6 and 4 tasks over the 2 input partitions
#: On a cluster, each sink gets a zombie (``before-prepare``: paused, its executor
#: killed, resumed after the batch is committed) and executors lost mid-write and after
#: the prepare. No driver point: the driver is one local process on a cluster as in local
#: mode, where the conformance cells cross every one of them.
CLUSTER_TWO_PHASE_POINTS = ("before-prepare", "mid-prepare", "after-prepare")
CLUSTER_KAFKA_POINTS = ("before-prepare", *KAFKA_POINTS)
#: The changelog cell's sinks whose input makes one key's changes cross tasks of a batch:
#: the source split into pieces (``minPartitions``), then a round-robin shuffle, each
#: refused before anything is written, then the fix the refusal names (``layouts.py``).
#: The Kafka sink refuses such a batch the same way (tests/spark/test_kafka_batch_commit.py);
#: its changelog query keeps its keys in one task, to cost no more runs here.
CROSSING_SINKS = ("postgres-changes", "redis-changes")
CROSSING_MIN_PARTITIONS = 4  # 2 pieces of each of the 2 input partitions
#: The records cell's Kafka sink in the default ``commitMode=batch``: its points are a
#: two-phase sink's, as are those of every Kafka query but :data:`TASK_COMMIT`.
BATCH_COMMIT = "kafka-batch"
#: The one Kafka query in the fallback ``commitMode=task``: the tasks commit.
TASK_COMMIT = "kafka-records"
#: On a cluster, the Kafka sink's batch commit: a zombie and an executor lost after its
#: flush (the driver's points are crossed locally).
CLUSTER_BATCH_KAFKA_POINTS = ("before-prepare", "after-prepare")


@dataclass(frozen=True)
class Cell:
    name: str
    short: str
    input: str  # "words", "timed" (event-time words) or "changes" (a change stream)
    sinks: tuple[tuple[str, str], ...]  # (sink kind, stage)

    @property
    def timed(self) -> bool:
        return self.input == "timed"


CELLS = {
    cell.name: cell
    for cell in (
        Cell(
            "running-count",
            "rc",
            "words",
            (("kafka", "processor"), ("postgres", "processor"), ("redis-increment", "processor")),
        ),
        Cell(
            "aggregate",
            "ag",
            "words",
            (("postgres", "count"), ("redis", "count"), ("postgres-append", "records")),
        ),
        Cell(
            "event-time",
            "et",
            "timed",
            (("kafka", "window"), ("postgres", "window"), ("redis", "window")),
        ),
        Cell("records", "rec", "words", (("kafka-records", "records"),)),
        Cell("batch-commit", "bc", "words", ((BATCH_COMMIT, "records"),)),
        Cell(
            "changelog",
            "cl",
            "changes",
            (
                ("postgres-changes", "changes"),
                ("redis-changes", "changes"),
                ("kafka-changes", "changes"),
            ),
        ),
    )
}


@dataclass(frozen=True)
class CustomSink:
    """A connector author's sink: format name, options, how to register it and read it back.

    The sink receives (word string, count long) rows in append mode: each changed
    word's new running count (``columns`` selects others of the running count's
    ``word``, ``count`` and ``delta``: ``("word", "delta AS count")`` gives each
    batch's change, for a sink that adds up). ``reader`` (``module:function``)
    returns the final {word: count} the sink holds; ``leftovers`` (``module:function``,
    optional) what it holds in doubt (a list of names); ``register`` (``module:Class``)
    names the DataSource to register when the format is not one of this package's.
    Several custom sinks in one run need a ``name`` each: the query is
    ``rc-custom-<name>`` (``rc-custom`` for the default name). ``points`` (with
    ``coverage="pairs"``): the fault points to cross, when not every one; a sink shown
    to fail crosses those that show its flaw.
    """

    format: str
    reader: str
    options: tuple[tuple[str, str], ...] = ()
    register: str | None = None
    name: str = ""
    columns: tuple[str, ...] = ("word", "count")
    leftovers: str | None = None
    points: tuple[str, ...] = ()

    @property
    def sink(self) -> str:
        """The Target's sink kind: ``custom`` or ``custom-<name>``."""
        return f"custom-{self.name}" if self.name else "custom"

    def public(self) -> dict[str, object]:
        """This sink as a report may show it: credentials in its options masked."""
        return {**asdict(self), "options": redact_options(dict(self.options))}

    def __repr__(self) -> str:
        return f"CustomSink({self.public()})"


@dataclass(frozen=True)
class Target:
    """One query of a harness run: its cell, sink kind, stage and where it writes."""

    cell: Cell
    sink: str
    stage: str
    tag: str  # the run's tag: names topics, tables and keys
    cluster: bool = False  # the pipeline runs on a Spark cluster: cluster faults too

    @property
    def name(self) -> str:
        return f"{self.cell.short}-{self.sink}"

    @property
    def family(self) -> str:
        """kafka, postgres, redis or custom: what ``--sinks`` selects by."""
        return self.sink.split("-")[0]

    @property
    def points(self) -> tuple[str, ...]:
        if self.sink == TASK_COMMIT:  # the tasks commit
            return CLUSTER_KAFKA_POINTS if self.cluster else KAFKA_POINTS
        if self.family == "kafka":  # a two-phase participant: the driver commits
            return CLUSTER_BATCH_KAFKA_POINTS if self.cluster else TWO_PHASE_POINTS
        return CLUSTER_TWO_PHASE_POINTS if self.cluster else TWO_PHASE_POINTS

    def in_task(self, point: str) -> bool:
        """Whether ``point`` fires in a task (else in the driver's commit)."""
        return point not in DRIVER_POINTS or self.sink == TASK_COMMIT

    def reaches(self, point: str) -> bool:
        """Whether the query's sink passes ``point`` (on a cluster too, where
        :attr:`points` leaves the driver's to the local cells)."""
        if self.sink == TASK_COMMIT:  # the tasks commit: no driver's point
            return point in CLUSTER_KAFKA_POINTS
        return point in TWO_PHASE_POINTS or point in self.points

    def action(self, point: str) -> str:
        """How a ``point`` of this query crashes, unless it is a whole-pipeline crash: on a
        cluster a zombie at ``before-prepare`` and a lost executor at the other task
        points; else the process at the point."""
        if self.cluster and point == "before-prepare":
            return "pause"
        if self.sink == TASK_COMMIT and point == "after-commit":
            return "restart"  # the query alone restarts, with another minPartitions
        return "executor" if self.cluster and self.in_task(point) else "process"

    @property
    def sink_id(self) -> str:
        return f"verify-{self.tag}-{self.name}"

    @property
    def output(self) -> str:
        """The Kafka topic, PostgreSQL table or Redis key prefix this query writes to."""
        if self.family == "postgres":
            return f"verify_{self.tag}_{self.name.replace('-', '_')}"
        if self.family == "redis":
            return f"verify:{self.tag}:{self.name}:"
        return f"verify-out-{self.tag}-{self.name}"

    def query(
        self, endpoints: Endpoints, topic: str, customs: tuple[CustomSink, ...] = ()
    ) -> QuerySpec:
        custom = self.custom_of(customs)
        columns, options = self._sink(endpoints, custom)
        fmt = custom.format if custom is not None else f"eos_{self.family}"
        varied = VARIED_MIN_PARTITIONS if self.sink == TASK_COMMIT else ()
        crossing = self.sink in CROSSING_SINKS
        return QuerySpec(
            self.name,
            topic,
            self.stage,
            fmt,
            columns,
            options,
            source_options={"minPartitions": str(CROSSING_MIN_PARTITIONS)} if crossing else {},
            vary_min_partitions=varied,
            layouts=LAYOUTS if crossing else (),
        )

    def custom_of(self, customs: tuple[CustomSink, ...]) -> CustomSink | None:
        """This query's custom sink, None for a built-in one."""
        return next((c for c in customs if c.sink == self.sink), None)

    def _sink(
        self, endpoints: Endpoints, custom: CustomSink | None
    ) -> tuple[tuple[str, ...], dict[str, str]]:
        if custom is not None:
            return custom.columns, dict(custom.options)
        own = {"sinkId": self.sink_id}
        if self.sink.endswith("-changes"):
            return self._changes_sink(endpoints, own)
        if self.family == "kafka":
            per_record = self.sink in (TASK_COMMIT, BATCH_COMMIT)
            value = "concat(partition, ':', offset)" if per_record else "count"
            columns = (
                "CAST(word AS BINARY) AS key",
                f"CAST(CAST({value} AS STRING) AS BINARY) AS value",
            )
            commit_mode = {"commitMode": "task"} if self.sink == TASK_COMMIT else {}
            return columns, {
                **own,
                **commit_mode,
                "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
                "topic": self.output,
            }
        if self.sink == "postgres-append":
            return ("word", "partition", "offset"), {
                **own,
                "dsn": endpoints.postgres_dsn,
                "table": self.output,
                "mode": "append",
                "createTable": "true",
            }
        if self.family == "postgres":
            return ("word", "count"), {
                **own,
                "dsn": endpoints.postgres_dsn,
                "table": self.output,
                "mode": "upsert",
                "keyColumns": "word",
                "createTable": "true",
            }
        value = "delta" if self.sink == "redis-increment" else "count"
        mode = "increment" if self.sink == "redis-increment" else "upsert"
        return ("word", value), {
            **own,
            "url": endpoints.redis_url,
            "keyColumn": "word",
            "valueColumns": value,
            "keyPrefix": self.output,
            "mode": mode,
        }

    def _changes_sink(
        self, endpoints: Endpoints, own: dict[str, str]
    ) -> tuple[tuple[str, ...], dict[str, str]]:
        """The changelog cell's sinks: each key's version as its value, deletes by ``op``,
        in ``partition, offset`` order."""
        changes = {"deleteColumn": "op", "deleteValue": "d"}
        ordered = {**changes, "orderColumns": "partition,offset"}
        columns: tuple[str, ...]
        if self.family == "kafka":
            columns = (
                "CAST(id AS BINARY) AS key",
                "CAST(CAST(version AS STRING) AS BINARY) AS value",
                "op",
            )
            options = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": self.output}
            return columns, {**own, **options, **changes}
        columns = ("id AS word", "version AS count", "op", "partition", "offset")
        if self.family == "postgres":
            return columns, {
                **own,
                **ordered,
                "dsn": endpoints.postgres_dsn,
                "table": self.output,
                "mode": "upsert",
                "keyColumns": "word",
                "createTable": "true",
            }
        return columns, {
            **own,
            **ordered,
            "url": endpoints.redis_url,
            "keyColumn": "word",
            "valueColumns": "count",
            "keyPrefix": self.output,
            "mode": "upsert",
        }

    def observed(self, endpoints: Endpoints, customs: tuple[CustomSink, ...]) -> checks.Observed:
        """What the sink holds now: counts per word, rows written twice, leftovers."""
        if self.sink == "kafka-changes":
            return checks.kafka_final_state(endpoints.kafka_bootstrap, self.output)
        if self.sink == "kafka":
            return checks.kafka_counts(endpoints.kafka_bootstrap, self.output)
        if self.sink in (TASK_COMMIT, BATCH_COMMIT):
            return checks.kafka_records(endpoints.kafka_bootstrap, self.output)
        if self.sink == "postgres-append":
            return checks.postgres_rows(endpoints.postgres_dsn, self.output, self.sink_id)
        if self.family == "postgres":
            return checks.postgres_counts(endpoints.postgres_dsn, self.output, self.sink_id)
        if self.family == "redis":
            return checks.redis_counts(endpoints.redis_url, self.output, self.sink_id)
        custom = self.custom_of(customs)
        assert custom is not None
        reader = load(custom.reader)
        assert callable(reader), f"{custom.reader} is not callable"
        leftovers: tuple[str, ...] = ()
        if custom.leftovers is not None:
            in_doubt = load(custom.leftovers)
            assert callable(in_doubt), f"{custom.leftovers} is not callable"
            leftovers = tuple(f"{custom.sink}: {name}" for name in in_doubt())
        return checks.Observed(dict(reader()), 0, leftovers)


def targets(
    cells: tuple[str, ...],
    families: tuple[str, ...],
    tag: str,
    customs: tuple[CustomSink, ...] = (),
    cluster: bool = False,
) -> list[Target]:
    """Every query of a run: each cell's sinks of the chosen families, and each custom sink
    (in the running-count cell)."""
    chosen = [
        Target(CELLS[name], sink, stage, tag, cluster)
        for name in cells
        for sink, stage in CELLS[name].sinks
        if sink.split("-")[0] in families
    ]
    rc = CELLS["running-count"]
    chosen += [Target(rc, c.sink, "processor", tag, cluster) for c in customs]
    return chosen


# -- what the event-time cell must produce ----------------------------------------------------


def window_counts(records: list[Record], batch_offsets: int) -> Counter[str]:
    """Each ``<word>@<window start>``'s count as Spark's windowed aggregation must emit it,
    from the committed input alone (one partition, in offset order) and the most offsets
    a batch reads: every window of the records that are not late, none of the tail's.
    See ``data.produce_timed_words`` for why that holds however the batches are cut."""
    windows = _windows(records, batch_offsets)
    return Counter(key for key, late in windows if late is False)


def late_records(records: list[Record], batch_offsets: int) -> int:
    """How many committed records the windowed count must drop as late."""
    return sum(1 for _key, late in _windows(records, batch_offsets) if late)


def _windows(records: list[Record], batch_offsets: int) -> list[tuple[str, bool | None]]:
    """Each committed record's window key, and whether the query drops it as late; None
    for the tail, whose window never closes. Spark drops a row of batch N when its window
    ended at or before the watermark of batch N-1, the largest event time of batches up to
    N-2 less the delay; a batch reads at most ``batch_offsets`` offsets. So a record is
    late whatever the batches when a record ``2 * batch_offsets`` offsets or more before it
    closes its window, and on time whatever the batches when no record before it does.
    Input that is neither is refused: the expectation would depend on the batches."""
    if len({r.partition for r in records}) > 1:
        raise EosError("the event-time input must be one partition")
    delay = WATERMARK_SECONDS * 1000
    ordered = sorted(records, key=lambda r: r.offset)
    tail_time = max((r.timestamp for r in ordered), default=0)
    found: list[tuple[str, bool | None]] = []
    newest_before = 0  # the largest event time before the record
    newest_far = 0  # ... at least 2 * batch_offsets offsets before it
    far = 0  # index into ordered of the next record that becomes "far"
    for record in ordered:
        while far < len(ordered) and ordered[far].offset <= record.offset - 2 * batch_offsets:
            newest_far = max(newest_far, ordered[far].timestamp)
            far += 1
        start = record.timestamp // 1000 // WINDOW_SECONDS * WINDOW_SECONDS
        key = f"{(record.key or b'').decode()}@{start}"
        end_ms = (start + WINDOW_SECONDS) * 1000
        if record.timestamp == tail_time:
            found.append((key, None))
        elif end_ms <= newest_far - delay:
            found.append((key, True))
        elif end_ms > newest_before - delay:
            found.append((key, False))
        else:
            raise EosError(
                f"record at offset {record.offset} is late or not depending on where the "
                f"batches of at most {batch_offsets} offsets fall"
            )
        newest_before = max(newest_before, record.timestamp)
    tail = [r.offset for r in ordered if r.timestamp == tail_time]
    if not tail or tail[-1] - tail[0] < batch_offsets:
        raise EosError(f"the event-time input needs a tail of more than {batch_offsets} offsets")
    return found
