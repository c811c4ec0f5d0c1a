"""The conformance cells: which stages feed which sinks, and what each sink must end up holding.

A *cell* is one kind of stateful pipeline crossed with every sink that fits it:

* ``running-count`` (a): ``transformWithStateInPandas`` running count per word ->
  ``eos_kafka``, ``eos_postgres`` upsert, ``eos_redis`` increment (of each batch's delta);
* ``aggregate`` (b): ``groupBy().count()`` in complete mode -> ``eos_postgres`` upsert,
  ``eos_redis`` upsert; and every record -> ``eos_postgres`` append;
* ``event-time`` (c): a 10-second tumbling-window count over the Kafka ``timestamp``
  with a 5-second watermark, append mode, from input with out-of-order and late
  records -> ``eos_kafka``, ``eos_postgres`` upsert, ``eos_redis`` upsert;
* ``records`` (d): every record straight from the source into ``eos_kafka``, no
  shuffle, so the source's split of a batch into tasks is the sink's task partitions,
  and ``minPartitions`` changes on every start of the query: a batch replayed after
  a crash between two tasks' commits must be split as it first was (the split is in
  its offset), or a task partition's marker speaks of other records.

Each (cell, sink) pair is one streaming query of one pipeline process, named
``<cell short name>-<sink>`` (``rc-kafka``): fault points are addressed to it by
that name. A connector author's sink joins the running-count cell as ``rc-custom``.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from eos_connectors.core.secrets import redact_options
from eos_connectors.core.topics import Record
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness import checks, load
from eos_connectors.dev.harness.spec import WINDOW_SECONDS, QuerySpec
from eos_connectors.sources.kafka.offsets import from_spark

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


@dataclass(frozen=True)
class Cell:
    name: str
    short: str
    timed: bool  # event-time input
    sinks: tuple[tuple[str, str], ...]  # (sink kind, stage)


CELLS = {
    cell.name: cell
    for cell in (
        Cell(
            "running-count",
            "rc",
            False,
            (("kafka", "processor"), ("postgres", "processor"), ("redis-increment", "processor")),
        ),
        Cell(
            "aggregate",
            "ag",
            False,
            (("postgres", "count"), ("redis", "count"), ("postgres-append", "records")),
        ),
        Cell(
            "event-time",
            "et",
            True,
            (("kafka", "window"), ("postgres", "window"), ("redis", "window")),
        ),
        Cell("records", "rec", False, (("kafka-records", "records"),)),
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
    ``rc-custom-<name>`` (``rc-custom`` for the default name).
    """

    format: str
    reader: str
    options: tuple[tuple[str, str], ...] = ()
    register: str | None = None
    name: str = ""
    columns: tuple[str, ...] = ("word", "count")
    leftovers: str | None = None

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
        if self.family == "kafka":
            return CLUSTER_KAFKA_POINTS if self.cluster else KAFKA_POINTS
        return CLUSTER_TWO_PHASE_POINTS if self.cluster else TWO_PHASE_POINTS

    def in_task(self, point: str) -> bool:
        """Whether ``point`` fires in a task (else in the driver's commit)."""
        return point not in DRIVER_POINTS or self.family == "kafka"  # Kafka tasks commit

    def action(self, point: str) -> str:
        """How a ``point`` of this query crashes, unless it is a whole-pipeline crash: on a
        cluster a zombie at ``before-prepare`` and a lost executor at the other task
        points; else the process at the point."""
        if self.cluster and point == "before-prepare":
            return "pause"
        if self.sink == "kafka-records" and point == "after-commit":
            return "group"  # the query restarts, with another minPartitions
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
        varied = VARIED_MIN_PARTITIONS if self.sink == "kafka-records" else ()
        return QuerySpec(
            self.name, topic, self.stage, fmt, columns, options, vary_min_partitions=varied
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
        if self.family == "kafka":
            value = "count" if self.sink == "kafka" else "concat(partition, ':', offset)"
            columns = (
                "CAST(word AS BINARY) AS key",
                f"CAST(CAST({value} AS STRING) AS BINARY) AS value",
            )
            return columns, {
                **own,
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

    def observed(self, endpoints: Endpoints, customs: tuple[CustomSink, ...]) -> checks.Observed:
        """What the sink holds now: counts per word, rows written twice, leftovers."""
        if self.sink == "kafka":
            return checks.kafka_counts(endpoints.kafka_bootstrap, self.output)
        if self.sink == "kafka-records":
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


def window_counts(records: list[Record], checkpoint: Path) -> Counter[str]:
    """Each ``<word>@<window start>``'s count as Spark's windowed aggregation must emit it,
    computed from the committed input and the batches the query's checkpoint records.

    Batch N reads [offsets/N-1, offsets/N) of each partition; a record is late, and
    dropped, when its window ends at or before the watermark of batch N-1 (Spark's
    watermark for late rows); a window is emitted once the last batch's watermark
    reaches its end. Spark stores each batch's watermark in ``offsets/N``, so a
    replay drops exactly the same records: this is the same on every replay.
    """
    counts: Counter[str] = Counter(key for key, late in _windowed(records, checkpoint) if not late)
    batches = _offsets_log(checkpoint)
    final = batches[max(batches)][0] if batches else 0
    return Counter({k: n for k, n in counts.items() if _window_end_ms(k) <= final})


def late_records(records: list[Record], checkpoint: Path) -> int:
    """How many committed records the windowed count dropped as late."""
    return sum(1 for _key, late in _windowed(records, checkpoint) if late)


def _windowed(records: list[Record], checkpoint: Path) -> Iterator[tuple[str, bool]]:
    """Each committed record read by the query's batches: its window key, and whether it
    was late in the batch that read it."""
    batches = _offsets_log(checkpoint)
    by_position = {(r.partition, r.offset): r for r in records}
    previous_end: dict[int, int] = {}
    late_watermark = 0
    for batch in sorted(batches):
        watermark, ends = batches[batch]
        for partition, end in ends.items():
            for offset in range(previous_end.get(partition, 0), end):
                record = by_position.get((partition, offset))
                if record is None:  # an aborted record or a transaction marker
                    continue
                start = record.timestamp // 1000 // WINDOW_SECONDS * WINDOW_SECONDS
                key = f"{(record.key or b'').decode()}@{start}"
                yield key, (start + WINDOW_SECONDS) * 1000 <= late_watermark
        previous_end = {**previous_end, **ends}
        late_watermark = watermark


def _window_end_ms(key: str) -> int:
    return (int(key.rsplit("@", 1)[1]) + WINDOW_SECONDS) * 1000


def _offsets_log(checkpoint: Path) -> dict[int, tuple[int, dict[int, int]]]:
    """Batch -> (its watermark in ms, its end offset per partition), from ``offsets/``."""
    found: dict[int, tuple[int, dict[int, int]]] = {}
    for path in (checkpoint / "offsets").iterdir():
        if not path.name.isdigit():
            continue
        lines = path.read_text().splitlines()
        metadata = json.loads(lines[1])
        ends = {p: o for (_topic, p), o in from_spark(json.loads(lines[2])).items()}
        found[int(path.name)] = (int(metadata.get("batchWatermarkMs", 0)), ends)
    return found
