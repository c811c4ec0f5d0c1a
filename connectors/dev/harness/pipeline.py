"""A pipeline of streaming queries run as its own OS process: ``eos_kafka`` -> stage -> sink.

``python -m eos_connectors.dev.harness.pipeline SPEC.json`` (see ``spec.py``) starts every
query of the spec in one Spark session and waits until all are done (availableNow)
or one fails. With ``restart_failed`` > 0 it restarts a query that failed, from
its checkpoint, in the same session, as an operator or an orchestrator would;
a query that fails again without committing a batch in between ends the process.
A task held at a fault point of action ``restart`` has its query stopped and started
again the same way (connectors/core/faults.py).
Each failure and restart is printed as an ``EOS-EVENT`` line, so the harness can
tell a planned fault from a failure of its own.

Fault points are armed through ``EOS_FAULT_*`` (see connectors/faults.py); the
process puts its own process group in ``EOS_FAULT_PGID`` so a fault can crash the
whole query.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eos_connectors.core import faults
from eos_connectors.dev.harness import drain, layouts
from eos_connectors.dev.harness.spec import (
    WATERMARK_SECONDS,
    WINDOW_SECONDS,
    PipelineSpec,
    QuerySpec,
)
from eos_connectors.ops.checkpoint import remove_unfinished_writes
from eos_connectors.ops.locations import location

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

EVENT_PREFIX = "EOS-EVENT "


def print_event(event: str, **fields: Any) -> None:
    """One JSON line on stdout, stamped with the wall clock (the harness and bench read them).

    Written in one call: the JVM writes its log to the same file, and between two writes
    (``print`` writes the line and its end separately when unbuffered) it can wedge its
    own text in."""
    line = EVENT_PREFIX + json.dumps({"event": event, "t": time.time(), **fields})
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def parse_event(line: str) -> dict[str, Any] | None:
    """The event a log line holds, wherever it starts in the line and whatever follows
    it (another process's text); None for any other line."""
    start = line.find(EVENT_PREFIX)
    if start < 0:
        return None
    try:
        event, _ = json.JSONDecoder().raw_decode(line, start + len(EVENT_PREFIX))
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


# -- stages ---------------------------------------------------------------------------------


def stage_frame(spark: SparkSession, spec: PipelineSpec, query: QuerySpec) -> DataFrame:
    """The query's source read through its stage (see ``spec.STAGES``)."""
    records = (
        spark.readStream.format(query.source)
        .option("kafka.bootstrap.servers", spec.bootstrap)
        .option("subscribe", query.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(query.max_offsets or spec.max_offsets))
        .options(**query.source_options, **_varied(spec, query), **drain.source_options(query))
        .load()
    )
    if query.stage == "records":
        return records.selectExpr("CAST(key AS STRING) AS word", "partition", "offset")
    if query.stage == "changes":
        return records.selectExpr(
            "CAST(key AS STRING) AS id",
            "substring_index(CAST(value AS STRING), ':', 1) AS op",
            "CAST(substring_index(CAST(value AS STRING), ':', -1) AS BIGINT) AS version",
            "partition",
            "offset",
        )
    if query.stage == "window":
        return _windowed_count(records)
    words = records.selectExpr("CAST(key AS STRING) AS word")
    if query.stage == "count":
        return words.groupBy("word").count()
    if query.stage == "processor":
        return words.groupBy("word").transformWithStateInPandas(
            statefulProcessor=running_count_processor(),
            outputStructType="word string, count long, delta long",
            outputMode="Append",
            timeMode="None",
        )
    raise SystemExit(f"query {query.name}: unknown stage {query.stage!r}")


def _varied(spec: PipelineSpec, query: QuerySpec) -> dict[str, str]:
    """``minPartitions`` for this start of ``query``, the next of its cycle: starts are
    counted in a file beside its checkpoint, so a new pipeline process goes on counting."""
    if not query.vary_min_partitions:
        return {}
    counter = location(spec.checkpoint) / f".{query.name}.starts"
    starts = int(counter.read_text()) if counter.exists() else 0
    counter.parent.mkdir(parents=True, exist_ok=True)
    counter.write_text(str(starts + 1))
    chosen = query.vary_min_partitions[starts % len(query.vary_min_partitions)]
    print_event("min-partitions", query=query.name, start=starts, min_partitions=chosen)
    return {"minPartitions": str(chosen)}


def _windowed_count(records: DataFrame) -> DataFrame:
    """Per word and tumbling event-time window of the Kafka timestamp, once the watermark
    passes the window's end: ``<word>@<window start>`` and the count."""
    from pyspark.sql import functions as F

    return (
        records.selectExpr("CAST(key AS STRING) AS word", "timestamp")
        .withWatermark("timestamp", f"{WATERMARK_SECONDS} seconds")
        .groupBy(F.window("timestamp", f"{WINDOW_SECONDS} seconds"), "word")
        .count()
        .selectExpr(
            "concat(word, '@', CAST(unix_timestamp(window.start) AS STRING)) AS word", "count"
        )
    )


def running_count_processor() -> Any:
    """A StatefulProcessor keeping each word's count in a ValueState; it emits the word's
    new count and this batch's delta."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import (
        StatefulProcessor,
        StatefulProcessorHandle,
    )

    class RunningCount(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.total = handle.getValueState("total", "total long")

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            stored = self.total.get() if self.total.exists() else None
            delta = sum(len(frame) for frame in rows)
            total = (int(stored[0]) if stored else 0) + delta
            self.total.update((total,))
            yield pd.DataFrame({"word": [key[0]], "count": [total], "delta": [delta]})

        def close(self) -> None:
            pass

    return RunningCount()


# -- queries --------------------------------------------------------------------------------


def start_query(spark: SparkSession, spec: PipelineSpec, query: QuerySpec) -> StreamingQuery:
    """Start ``query`` from its checkpoint, first removing the files of a batch write a
    crash cut short (``eos checkpoint clean``, as an orchestrator restarting it would)."""
    removed = remove_unfinished_writes(location(spec.checkpoint) / query.name)
    if removed:
        print_event("unfinished-writes-removed", query=query.name, files=removed)
    layout = layouts.current(spec, query)
    if layout is not None:
        print_event("layout", query=query.name, layout=layout)
    sink_input = stage_frame(spark, spec, query).selectExpr(*query.columns)
    writer = (
        layouts.apply(sink_input, layout, layouts.key_column(query))
        .writeStream.format(query.format)
        .outputMode(query.output_mode)
        .queryName(query.name)
        .option("checkpointLocation", str(location(spec.checkpoint) / query.name))
    )
    for key, value in query.options.items():
        writer = writer.option(key, value)
    if spec.trigger == "available-now" and not drain.drains(spec):
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=spec.every)
    return writer.start()


def committed(spec: PipelineSpec, query: QuerySpec) -> int:
    commits = location(spec.checkpoint) / query.name / "commits"
    return sum(1 for f in commits.iterdir() if f.name.isdigit()) if commits.exists() else 0


class Supervisor:
    """Runs the spec's queries to their end, restarting failed ones within the allowance.

    A query that fails while Spark is still initialising its sources (no code of a
    sink has run) is started again up to ``START_RETRIES`` times; such a failure is
    reported with ``"initializing": true``. So is one whose Python worker never
    started: Spark gives a new worker 10 s (not configurable) to connect back, which a
    busy 2-core machine can exceed at any batch; that attempt ran no sink code, and the
    restart replays the batch like any crash. It is reported with ``"starved": true``.
    """

    START_RETRIES = 3
    STARVED = "Python worker failed to connect back"

    def __init__(self, spark: SparkSession, spec: PipelineSpec) -> None:
        self.spark = spark
        self.spec = spec
        self.by_name = {q.name: q for q in spec.queries}
        self.running: dict[str, StreamingQuery] = {}
        self.initialized: dict[str, bool] = {}
        self.restarts: Counter[str] = Counter()
        self.start_failures: Counter[str] = Counter()
        self.failed_at: dict[str, int] = {}
        self.drain = drain.Drain(spec) if drain.drains(spec) else None

    def run(self) -> None:
        for query in self.spec.queries:
            self._start(query)
            if self.spec.events:
                print_event("ready", query=query.name)
        while self.running:
            time.sleep(0.2)
            self._restart_requested()
            for name, handle in list(self.running.items()):
                if handle.isActive and self.drain and self.drain.done(self.by_name[name]):
                    handle.stop()  # PySpark 4.0-4.1: availableNow by hand (drain.py)
                if handle.isActive:
                    continue
                del self.running[name]
                error = handle.exception()
                if error is not None:
                    self._failed(self.by_name[name], str(error))

    def _start(self, query: QuerySpec, timeout: float = 60.0) -> None:
        """Start ``query`` and wait until its sources are initialised, one query at a
        time, so their Python processes do not all start at once."""
        handle = start_query(self.spark, self.spec, query)
        self.running[query.name] = handle
        deadline = time.monotonic() + timeout
        while handle.isActive and time.monotonic() < deadline:
            if handle.status.get("message") != "Initializing sources":
                break
            time.sleep(0.05)
        self.initialized[query.name] = handle.isActive

    def _failed(self, query: QuerySpec, error: str) -> None:
        crossing = layouts.current(self.spec, query) in layouts.CROSSING
        if crossing and layouts.REFUSAL in error:
            self._refused(query, error)
            return
        first_line = next((line for line in error.splitlines() if line.strip()), error)
        initializing = not self.initialized.get(query.name)
        starved = first_line.startswith(self.STARVED)
        print_event(
            "query-failed",
            query=query.name,
            error=first_line[:500],
            cause=failure_cause(error)[:1000],
            initializing=initializing,
            starved=starved,
        )
        if (initializing or starved) and self.start_failures[query.name] < self.START_RETRIES:
            self.start_failures[query.name] += 1
            self._restart(query)
            return
        progress = committed(self.spec, query)
        repeated = self.failed_at.get(query.name) == progress
        if repeated or self.restarts[query.name] >= self.spec.restart_failed:
            print(f"query {query.name} failed: {error}", file=sys.stderr, flush=True)
            raise SystemExit(1)
        self.failed_at[query.name] = progress
        self.restarts[query.name] += 1
        self._restart(query)

    def _restart_requested(self) -> None:
        """Each query a task holds at a ``restart`` fault point: stop it (its batch fails
        after the point), let the held process go (Spark has killed it with its task, as a
        rule), and start the query again from its checkpoint, with the next
        ``minPartitions`` of its cycle if it has one."""
        marker = os.environ.get("EOS_FAULT_MARKER")
        if not marker:
            return
        for entry, where in faults.fired(Path(marker)).items():
            resume = Path(marker) / f"{entry}.resume"
            name = str(where.get("query"))
            if faults.Entry.parse(entry).action != "restart" or resume.exists():
                continue
            if name in self.running:
                print_event("query-stopping", query=name, entry=entry)
                self.running.pop(name).stop()
                resume.touch()
                self._restart(self.by_name[name])

    def _refused(self, query: QuerySpec, error: str) -> None:
        """The sink refused a batch whose key reached two tasks: report what it holds
        now (nothing of the refused batch may be there) and restart in the next layout."""
        message = next((line for line in error.splitlines() if "reached two tasks" in line), "")
        print_event(
            "refused",
            query=query.name,
            layout=layouts.current(self.spec, query),
            committed=committed(self.spec, query),
            held=layouts.held(query),
            message=message.strip()[:600],
        )
        layouts.advance(self.spec, query)
        self._restart(query)

    def _restart(self, query: QuerySpec) -> None:
        self.spark.streams.resetTerminated()
        self._start(query)
        print_event("query-restarted", query=query.name, committed=committed(self.spec, query))


#: A Python exception's line in a traceback: ``package.module.SomeError: message``.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def failure_cause(error: str) -> str:
    """The last exception line of a failed query's error: Spark's first line of a Python
    data source's failure says only ``Traceback (most recent call last):``."""
    found = [line for line in error.splitlines() if _EXCEPTION_LINE.match(line)]
    return found[-1] if found else ""


def _batch_events() -> Any:
    """A listener printing each batch's rows and Spark's own timings once it is committed."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class BatchEvents(StreamingQueryListener):  # type: ignore[misc]
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            print_event(
                "batch",
                query=progress.name,
                batch=progress.batchId,
                records=progress.numInputRows,
                outputs=_outputs(progress),
                state_rows=_state_rows(progress),
                durations=dict(progress.durationMs),
            )

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return BatchEvents()


def _outputs(progress: Any) -> int | None:
    """Rows the batch wrote to its sink as the sink reports them; None for a sink that
    reports none (-1, as Python sinks do)."""
    written = int(progress.sink.numOutputRows) if progress.sink is not None else -1
    return written if written >= 0 else None


def _state_rows(progress: Any) -> int:
    """Rows in the query's state after the batch (what a complete-mode query writes)."""
    return sum(int(op.numRowsTotal) for op in progress.stateOperators or ())


def register_sources(spark: SparkSession, references: tuple[str, ...]) -> None:
    from pyspark.sql.datasource import DataSource

    from eos_connectors.dev.harness import load

    for reference in references:
        source = load(reference)
        if not (isinstance(source, type) and issubclass(source, DataSource)):
            raise SystemExit(f"register {reference}: not a pyspark DataSource class")
        spark.dataSource.register(source)


STANDBY_NICENESS = 10


def wait_for(go: Path) -> None:
    """A standby waits, warm, until the harness creates ``go`` (or stops waiting when
    its parent, the harness, is gone), then takes back its normal priority."""
    parent = os.getppid()
    while not go.exists():
        if os.getppid() != parent:
            raise SystemExit("standby: the harness is gone")
        time.sleep(0.05)
    renice_tree(os.getpid(), 0)


def renice_tree(root: int, niceness: int) -> None:
    """Set every thread of ``root`` and of its descendants to ``niceness`` (Linux keeps
    niceness per thread). Lowering it needs privileges; without them nothing changes
    and the whole pipeline stays at the standby's niceness, which harms nothing: the
    run it replaces is gone."""
    import psutil

    try:
        top = psutil.Process(root)
        tree = [top, *top.children(recursive=True)]
    except psutil.Error:
        return
    for process in tree:
        with contextlib.suppress(psutil.Error):
            for thread in process.threads():
                with contextlib.suppress(PermissionError, ProcessLookupError):
                    os.setpriority(os.PRIO_PROCESS, thread.id, niceness)


def main(argv: list[str] | None = None) -> None:
    """``SPEC.json [--standby GO_FILE]``: with ``--standby`` the process starts Spark, warms
    it up, then waits for GO_FILE before it starts the queries: the harness keeps one
    ready so a restart after a crash skips Spark's start-up."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--standby"):
        raise SystemExit(
            "usage: python -m eos_connectors.dev.harness.pipeline SPEC.json [--standby GO]"
        )
    spec = PipelineSpec.read(Path(args[0]))
    os.environ["EOS_FAULT_PGID"] = str(os.getpgid(0))
    if len(args) == 3:
        os.nice(STANDBY_NICENESS)  # its start-up must not starve the run it stands by for
    from eos_connectors.dev.warm_up import warm_up
    from eos_connectors.ops.session import local_session

    spark = local_session(spec.app, cores=spec.cores, conf=spec.conf, master=spec.master)
    register_sources(spark, spec.register)
    if len(args) == 3:
        warm_up(spark)
        wait_for(Path(args[2]))
    listener = _batch_events() if spec.events else None
    if listener is not None:
        spark.streams.addListener(listener)
    status = 1
    try:
        Supervisor(spark, spec).run()
        status = 0
    finally:
        if not stopped_within(spark, listener, STOP_TIMEOUT):
            print(f"the session did not stop in {STOP_TIMEOUT:.0f} s", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(status)


#: Seconds the pipeline gives its session to stop once its queries are done (every batch
#: is committed by then; a local session stops in 1-2 s). Over Spark Connect the stop
#: can deadlock (see :func:`stopped_within`): 30 s here cost the Connect test that long
#: at 0.1 cores busy in CI, every run.
STOP_TIMEOUT = 5.0


def stopped_within(spark: SparkSession, listener: Any, timeout: float) -> bool:
    """Remove ``listener`` and stop the session on a thread; whether that ended within
    ``timeout`` seconds. Over Spark Connect the listener runs on a client thread that
    would keep the process alive, so it must be removed; and removing the last one can
    deadlock when an event is pending (SPARK-59623, open at the time of writing): the
    queries are done by then, so the process may end without it (a local Spark's JVM,
    and a local Connect server with it, ends when its Python parent does)."""

    def stop() -> None:
        if listener is not None:
            spark.streams.removeListener(listener)
        spark.stop()

    worker = threading.Thread(target=stop, name="eos-stop", daemon=True)
    worker.start()
    worker.join(timeout)
    return not worker.is_alive()


if __name__ == "__main__":
    main()
