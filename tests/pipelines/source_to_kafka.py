"""A pipeline run as its own OS process by crash tests: eos_kafka -> eos_kafka, no stage.

The sink's tasks are the source's read tasks (nothing shuffles in between), so the
source's split of a batch decides which records each sink task partition writes.
``--cores 1`` runs the tasks one after the other, so a fault addressed to the last
partition (``before-prepare@0#3``) fires once every other task has prepared (in the
sink's default ``commitMode=batch``) or committed (``--commit-mode task``).
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out-topic", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--sink-id", required=True)
    parser.add_argument("--min-partitions", default=None)
    parser.add_argument("--max-offsets", default="100000")
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--commit-mode", default=None, help="the sink's commitMode")
    args = parser.parse_args()
    os.environ["EOS_FAULT_PGID"] = str(os.getpgid(0))

    from eos_connectors.ops.session import local_session

    spark = local_session("source-to-kafka", cores=args.cores)
    run(spark, args.bootstrap, args.topic, args.out_topic, args.checkpoint, args.sink_id,
        args.min_partitions, args.max_offsets, args.commit_mode)  # fmt: skip
    spark.stop()


def run(
    spark: SparkSession,
    bootstrap: str,
    topic: str,
    out_topic: str,
    checkpoint: str,
    sink_id: str,
    min_partitions: str | None = None,
    max_offsets: str = "100000",
    commit_mode: str | None = None,
) -> None:
    """The query, run to the end of its input (``availableNow``; a drained ``processingTime``
    trigger on PySpark 4.0-4.1: tests.sink_util.to_the_end) in ``spark``: a process of its
    own for a crash test, the test session's Spark for a query that is not crashed; a
    failed query raises."""
    from tests.sink_util import BOUNDED, to_the_end

    reader = (
        spark.readStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_offsets)
        .options(**BOUNDED)
    )
    if min_partitions:
        reader = reader.option("minPartitions", min_partitions)
    writer = (
        reader.load()
        .select("key", "value")
        .writeStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", out_topic)
        .option("sinkId", sink_id)
        .option("checkpointLocation", checkpoint)
    )
    if commit_mode:
        writer = writer.option("commitMode", commit_mode)
    to_the_end(writer, checkpoint, bootstrap, topic)


if __name__ == "__main__":
    main()
