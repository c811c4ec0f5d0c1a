"""What the sinks need of a PySpark release, checked on the running one.

The sinks name every unit by the task's identity (:class:`TaskIdentity`): the batch id
and the query id from the streaming task's local properties, the run id from its job
description. This runs a short stream (``rate`` into a probe sink) and checks, for every
task of every batch, that the identity a task reads is the one the driver's ``commit``
gets: the same batch id, the query's id and the run's id. And that ``outputMode("update")``
is still refused by Spark itself for a Python sink, before any of its code runs (the
docs say so and name the alternatives).

``python -m eos_connectors.dev.release_check`` prints one line and exits non-zero on a
mismatch (``make spark-matrix`` runs it in each release's virtualenv; CI through
tests/spark/test_spark_releases.py). ~15 s.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, WriterCommitMessage

from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.spark_api import StreamArrowWriter, release


@dataclass
class _Seen(WriterCommitMessage):
    identity: dict[str, Any]


class _ProbeWriter(StreamArrowWriter):
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, iterator: Any) -> _Seen:
        for _ in iterator:
            pass
        return _Seen(asdict(TaskIdentity.current()))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: what each task saw, beside the batch id Spark commits."""
        with open(self.path, "a") as out:
            for message in messages:
                if isinstance(message, _Seen):
                    out.write(json.dumps({"commit": batchId, **message.identity}) + "\n")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class IdentityProbe(DataSource):
    """A sink that records each task's identity and the batch id of the driver's commit."""

    @classmethod
    def name(cls) -> str:
        return "eos_identity_probe"

    def streamWriter(self, schema: Any, overwrite: bool) -> _ProbeWriter:
        return _ProbeWriter(self.options["path"])


def check(batches: int = 3) -> list[str]:
    """Run the probe on a local session; the mismatches found ([] when the release is fit)."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
    )
    spark.dataSource.register(IdentityProbe)
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / "seen.jsonl"
        query = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", 50)
            .option("numPartitions", 2)
            .load()
            .writeStream.format("eos_identity_probe")
            .option("path", str(path))
            .option("checkpointLocation", str(Path(work) / "checkpoint"))
            .trigger(processingTime="1 second")
            .start()
        )
        deadline = time.monotonic() + 120
        while _commits(path) < batches and time.monotonic() < deadline and query.isActive:
            time.sleep(0.2)
        query.stop()
        seen = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        found = _mismatches(seen, query.id, str(query.runId), batches)
        return found + _update_mode_accepted(spark, Path(work))


def _update_mode_accepted(spark: Any, work: Path) -> list[str]:
    """[] when Spark refuses ``outputMode("update")`` into a Python sink, as the docs say."""
    counts = spark.readStream.format("rate").load().groupBy("value").count()
    query = (
        counts.writeStream.format("eos_identity_probe")
        .option("path", str(work / "update.jsonl"))
        .option("checkpointLocation", str(work / "update-checkpoint"))
        .outputMode("update")
        .start()
    )
    try:
        query.awaitTermination(60)
    except Exception as refused:  # Spark's own error, whatever its class
        if "does not support Update mode" in str(refused):
            return []
        return [f"update mode failed otherwise: {str(refused)[:300]}"]
    finally:
        query.stop()
    return ["update mode was accepted: the docs' alternatives are out of date"]


def _commits(path: Path) -> int:
    if not path.exists():
        return 0
    return len({json.loads(line)["commit"] for line in path.read_text().splitlines()})


def _mismatches(seen: list[dict[str, Any]], query_id: str, run_id: str, batches: int) -> list[str]:
    found = [] if len({s["commit"] for s in seen}) >= batches else [f"fewer than {batches} batches"]
    for task in seen:
        if task["batch_id"] != task["commit"]:
            found.append(f"a task of batch {task['commit']} read batch id {task['batch_id']}")
        if task["query_id"] != query_id:
            found.append(f"a task read query id {task['query_id']}, not {query_id}")
        if task["run_id"] != run_id:
            found.append(f"a task read run id {task['run_id']}, not {run_id}")
    return found


def main() -> None:
    mismatches = check()
    if mismatches:
        print(f"PySpark {release()}: " + "; ".join(sorted(set(mismatches))))
        sys.exit(1)
    print(
        f"PySpark {release()}: every task's batch id, query id and run id match the "
        "driver's; Spark refuses update mode into a Python sink"
    )


if __name__ == "__main__":
    main()
