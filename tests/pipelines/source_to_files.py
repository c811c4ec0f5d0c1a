"""A pipeline run as its own OS process by crash tests: eos_kafka -> one JSON file per batch.

Each micro-batch's records (partition, offset, value) go to ``out/batch-<id>.json``
through an atomic rename, so a replayed batch replaces its own file: the files
show exactly what each batch id read on its last attempt.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-offsets", default="100")
    parser.add_argument(
        "--trigger", choices=["available-now", "continuous"], default="available-now"
    )
    args = parser.parse_args()
    os.environ["EOS_FAULT_PGID"] = str(os.getpgid(0))

    from eos_connectors.ops.session import local_session

    spark = local_session("source-to-files")
    run(spark, args.bootstrap, args.topic, args.checkpoint, Path(args.out), args.max_offsets,
        args.trigger)  # fmt: skip


def run(
    spark: Any,
    bootstrap: str,
    topic: str,
    checkpoint: str,
    out: Path,
    max_offsets: str = "100",
    trigger: str = "available-now",
) -> None:
    """The query in ``spark``: a process of its own for a crash test, the test session's
    Spark for a run that is not crashed (an available-now run returns at its end: on
    PySpark 4.0-4.1 a drained processingTime trigger, tests.sink_util.to_the_end)."""
    from tests.sink_util import BOUNDED, to_the_end

    out.mkdir(parents=True, exist_ok=True)

    def write_batch(df: Any, batch_id: int) -> None:
        rows = [[r["partition"], r["offset"], bytes(r["value"]).decode()] for r in df.collect()]
        temporary = out / f".batch-{batch_id}.tmp"
        temporary.write_text(json.dumps(rows))
        temporary.rename(out / f"batch-{batch_id}.json")

    stream = (
        spark.readStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", max_offsets)
        .options(**BOUNDED)
        .load()
        .select("partition", "offset", "value")
    )
    writer = stream.writeStream.foreachBatch(write_batch).option("checkpointLocation", checkpoint)
    if trigger == "available-now":
        to_the_end(writer, checkpoint, bootstrap, topic)
    else:
        writer.trigger(processingTime="200 milliseconds").start().awaitTermination()


if __name__ == "__main__":
    main()
