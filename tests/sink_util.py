"""An eos_kafka topic as a stream, and one availableNow query from it into a sink, in the
test's session."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame, SparkSession

from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.spark_api import HAS_READ_LIMITS
from eos_connectors.core.topics import end_offsets
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.ops.checkpoint import batches, read_offsets
from eos_connectors.ops.locations import location
from eos_connectors.sources.kafka.offsets import from_spark

if TYPE_CHECKING:
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

#: Seconds :func:`to_the_end` gives a query.
RUN_SECONDS = 300
#: What a source bounded by a read limit needs on PySpark 4.0-4.1 (:func:`to_the_end`).
BOUNDED = {} if HAS_READ_LIMITS else {"legacyReadLimits": "true"}


def to_the_end(
    writer: DataStreamWriter, checkpoint: str, bootstrap: str, topic: str
) -> StreamingQuery:
    """``writer``'s query run to the end of ``topic`` (written before it starts), ended:
    ``availableNow`` on PySpark 4.2+; on 4.0-4.1, which run ``availableNow`` as one batch,
    a ``processingTime`` trigger stopped once a committed batch reached the topic's end
    (the source bounding its batches: :data:`BOUNDED`). A failed query raises its error."""
    if HAS_READ_LIMITS:
        query = writer.trigger(availableNow=True).start()
        if not query.awaitTermination(RUN_SECONDS):
            query.stop()
            raise AssertionError(f"the query did not finish in {RUN_SECONDS} s")
        return _ended(query)
    ends = {(topic, p): end for p, end in end_offsets(plaintext(bootstrap), topic).items()}
    folder = location(checkpoint)
    query = writer.trigger(processingTime="200 milliseconds").start()
    deadline = time.monotonic() + RUN_SECONDS
    try:
        while query.isActive and not _reached(folder, ends):
            if time.monotonic() > deadline:
                raise AssertionError(f"the query did not reach {topic}'s end in {RUN_SECONDS} s")
            time.sleep(0.25)
    finally:
        query.stop()
    return _ended(query)


def _ended(query: StreamingQuery) -> StreamingQuery:
    error = query.exception()
    if error is not None:
        raise error
    return query


def _reached(folder: Any, ends: dict[tuple[str, int], int]) -> bool:
    committed = batches(folder / "commits")
    if not committed:
        return False
    _, sources = read_offsets(folder, committed[-1])
    reached = from_spark(sources[-1])
    return all(reached.get(tp, -1) >= end for tp, end in ends.items())


def earliest(spark: SparkSession, endpoints: Endpoints, topic: str) -> DataFrame:
    """``topic`` through eos_kafka from its earliest offset."""
    return (
        spark.readStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )


def stream_into(
    spark: SparkSession,
    endpoints: Endpoints,
    topic: str,
    checkpoint: Path,
    select: list[str],
    sink: str,
    /,
    **options: str,
) -> None:
    """``topic`` from the earliest offset, ``select``ed, into format ``sink`` with
    ``options`` (positional-only parameters: an option may be called ``topic``); a
    failing query raises."""
    writer = earliest(spark, endpoints, topic).selectExpr(*select).writeStream.format(sink)
    for key, value in options.items():
        writer = writer.option(key, value)
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination(300)


def delete_last_batch(checkpoint: Path) -> tuple[int, dict[str, str]]:
    """The checkpoint put back by one batch, as an operator does by hand: its last
    ``offsets/N`` and ``commits/N`` deleted. Returns N and their texts by relative path,
    for :func:`put_files_back`."""
    last = max(batches(location(str(checkpoint)) / "offsets"))
    deleted = {f"{log}/{last}": (checkpoint / log / str(last)).read_text() for log in _LOGS}
    for name in deleted:
        (checkpoint / name).unlink()
    return last, deleted


def put_files_back(checkpoint: Path, files: dict[str, str]) -> None:
    """Files :func:`delete_last_batch` took, written back (over a replanned ``offsets/N``)."""
    for name, text in files.items():
        (checkpoint / name).write_text(text)


#: A checkpoint's batch logs.
_LOGS = ("offsets", "commits")
