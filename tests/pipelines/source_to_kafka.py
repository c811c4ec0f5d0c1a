"""A pipeline run as its own OS process by crash tests: eos_kafka -> eos_kafka, no stage.

The sink's tasks are the source's read tasks (nothing shuffles in between), so the
source's split of a batch decides which records each sink task partition writes.
``--cores 1`` runs the tasks one after the other, so a fault addressed to the last
partition (``before-prepare@0#3``) fires once every other task has committed.
"""

from __future__ import annotations

import argparse
import os


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
    args = parser.parse_args()
    os.environ["EOS_FAULT_PGID"] = str(os.getpgid(0))

    from eos_connectors.ops.session import local_session

    spark = local_session("source-to-kafka", cores=args.cores)
    reader = (
        spark.readStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_offsets)
    )
    if args.min_partitions:
        reader = reader.option("minPartitions", args.min_partitions)
    query = (
        reader.load()
        .select("key", "value")
        .writeStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", args.out_topic)
        .option("sinkId", args.sink_id)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
