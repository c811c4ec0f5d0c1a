"""One side of the parity suite, as its own Spark process: Spark's JVM ``kafka`` format
(``--format kafka --jars ...``) or ``eos_kafka``, the same calls but the format's name.

It reads ``--read-topic`` as a batch and as a stream (read_committed, headers
included) into ``OUT/batch.jsonl`` and ``OUT/stream.jsonl``, and streams
``--write-input`` into ``--write-topic`` (key, value, headers) with the format's sink.
"""

from __future__ import annotations

import argparse
import base64
import json
from pathlib import Path
from typing import Any


def _b64(value: bytes | None) -> str | None:
    return None if value is None else base64.b64encode(bytes(value)).decode()


def _row(row: Any) -> dict[str, Any]:
    return {
        "key": _b64(row["key"]),
        "value": _b64(row["value"]),
        "topic": row["topic"],
        "partition": row["partition"],
        "offset": row["offset"],
        "timestamp": round(row["timestamp"].timestamp() * 1000),
        "timestampType": row["timestampType"],
        "headers": [[h["key"], _b64(h["value"])] for h in row["headers"]]
        if row["headers"]
        else None,
    }


def _save(rows: list[Any], path: Path) -> None:
    path.write_text("".join(json.dumps(_row(r)) + "\n" for r in rows))


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--format", "--bootstrap", "--read-topic", "--write-input", "--write-topic"):
        parser.add_argument(name, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--jars", default="")
    args = parser.parse_args()

    from eos_connectors.ops.session import local_session

    conf = {"spark.jars": args.jars} if args.jars else {}
    spark = local_session(f"parity-{args.format}", conf=conf)
    out = Path(args.out)
    common = {
        "kafka.bootstrap.servers": args.bootstrap,
        "kafka.isolation.level": "read_committed",
        "includeHeaders": "true",
    }
    batch = spark.read.format(args.format).options(**common).option("subscribe", args.read_topic)
    _save(batch.load().collect(), out / "batch.jsonl")

    def stream(topic: str) -> Any:
        reader = spark.readStream.format(args.format).options(**common)
        return reader.option("subscribe", topic).option("startingOffsets", "earliest").load()

    streamed: list[Any] = []
    query = (
        stream(args.read_topic)
        .writeStream.foreachBatch(lambda rows, _id: streamed.extend(rows.collect()))
        .option("checkpointLocation", str(out / "read-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    _save(streamed, out / "stream.jsonl")

    sink = {"kafka.bootstrap.servers": args.bootstrap, "topic": args.write_topic}
    if args.format == "eos_kafka":
        sink["sinkId"] = f"parity-{args.write_topic}"
    query = (
        stream(args.write_input)
        .select("key", "value", "headers")
        .writeStream.format(args.format)
        .options(**sink)
        .option("checkpointLocation", str(out / "write-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    spark.stop()


if __name__ == "__main__":
    main()
