"""What the source's Spark tests share: an eos_kafka stream, queries that run it to the end
or from a checkpoint, and its rows as records."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from eos_connectors.core.topics import Record
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sources.kafka.offsets import SourceOffset
from tests.sink_util import BOUNDED, to_the_end

#: The source's options that need Spark's read limits (PySpark 4.2+), else :data:`BOUNDED`.
READ_LIMITS = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")


def stream_of(spark: SparkSession, endpoints: Endpoints, **options: str) -> DataFrame:
    """An eos_kafka stream; with a read limit on PySpark 4.0-4.1 the source applies it
    itself (``legacyReadLimits``: run it with :func:`run_bounded`)."""
    reader = spark.readStream.format("eos_kafka").option(
        "kafka.bootstrap.servers", endpoints.kafka_bootstrap
    )
    if any(k in options for k in READ_LIMITS):
        options = {**options, **BOUNDED}
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def run_bounded(
    df: DataFrame, checkpoint: Path, bootstrap: str, topic: str
) -> tuple[list[Any], list[dict[str, Any]]]:
    """A stream whose batches a read limit bounds, into a memory table, run to the end of
    ``topic`` (:func:`tests.sink_util.to_the_end`); its rows and progress."""
    name = f"q_{uuid.uuid4().hex[:8]}"
    writer = (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
    )
    query = to_the_end(writer, str(checkpoint), bootstrap, topic)
    return df.sparkSession.table(name).collect(), progress_of(query)


def run_available_now(df: DataFrame, checkpoint: Path) -> tuple[list[Any], list[dict[str, Any]]]:
    name = f"q_{uuid.uuid4().hex[:8]}"
    query = (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert not query.isActive, "availableNow query did not finish"
    rows = df.sparkSession.table(name).collect()
    return rows, progress_of(query)


def progress_of(query: StreamingQuery) -> list[dict[str, Any]]:
    """The query's recent progress as Spark wrote it (JSON): PySpark 4.0's progress objects
    give a source's offsets as Python reprs, not JSON."""
    return [json.loads(p.json) for p in query.recentProgress]


def run_from_checkpoint(df: DataFrame, checkpoint: Path) -> list[Any]:
    """An availableNow run that may resume ``checkpoint``; the rows of the batches it ran
    (the memory sink refuses to resume a checkpoint, foreachBatch does not)."""
    rows: list[Any] = []
    query = (
        df.writeStream.foreachBatch(lambda batch, _id: rows.extend(batch.collect()))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    assert not query.isActive, "availableNow query did not finish"
    return rows


def start_memory(
    df: DataFrame, name: str, checkpoint: Path, every: str = "500 milliseconds"
) -> StreamingQuery:
    """A running query into the memory table ``name``, triggered ``every`` so often."""
    return (
        df.writeStream.format("memory")
        .queryName(name)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=every)
        .start()
    )


def json_field(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def records_of(rows: list[Any]) -> list[Record]:
    return sorted(
        Record(r["partition"], r["offset"], bytes(r["key"]), bytes(r["value"])) for r in rows
    )


def forget_topic_ids(checkpoint: Path) -> None:
    """Rewrite the offsets log as a version that kept no topic ids wrote it."""
    for path in (checkpoint / "offsets").iterdir():
        if path.name.isdigit():
            lines = path.read_text().splitlines()
            offsets = {k: v for k, v in json.loads(lines[-1]).items() if not k.startswith("@")}
            path.write_text("\n".join([*lines[:-1], json.dumps(offsets)]))
            (path.parent / f".{path.name}.crc").unlink(missing_ok=True)


def offsets_file(checkpoint: Path, batch: int) -> SourceOffset:
    return SourceOffset.from_spark(
        json.loads((checkpoint / "offsets" / str(batch)).read_text().splitlines()[-1])
    )


def wait_for(condition: Any, what: str, explain: Any = None, timeout: float = 120) -> None:
    """Wait for ``condition()``; an AssertionError naming ``what`` (and what ``explain()``
    says) after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}" + (f": {explain()}" if explain else ""))


def latest_after(endpoints: Endpoints, previous: SourceOffset, **options: str) -> SourceOffset:
    """What the driver plans next from ``previous`` (latestOffset on the real broker)."""
    from eos_connectors.core.spark_api import ReadAllAvailable
    from eos_connectors.sources.kafka.options import parse_options
    from eos_connectors.sources.kafka.stream_reader import KafkaStreamReader

    raw = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, **options}
    reader = KafkaStreamReader(parse_options(raw))
    return SourceOffset.from_spark(reader.latestOffset(previous.to_spark(), ReadAllAvailable()))
