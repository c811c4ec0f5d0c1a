"""Spark's driver-side processes that plan and commit a sink's batches keep the package's
imports frozen out of the collector from their second call on
(:mod:`eos_connectors.core.driver_gc`): PySpark's daemon collects garbage after every
call, which walked 43,000-68,000 objects (16-36 ms of CPU) twice a batch.

Cost: ~8 s (a rate stream of a few batches into a sink that records, in its commit, the
commit process and what is frozen there)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from tests.source_util import wait_for

pytestmark = pytest.mark.spark


def _commits_seen(spark: SparkSession, tmp_path: Path, batches: int) -> list[dict[str, int]]:
    """The stream; each commit's process id and freeze count, in order."""
    from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
    from pyspark.sql.types import StructType

    from eos_connectors.core.batch_job import SinkFormat

    class Recorder(DataSourceStreamWriter):  # defined here: pickled by value
        def __init__(self, path: str) -> None:
            self.path = path

        def write(self, iterator: Any) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: Any, batchId: int) -> None:  # the commit's process
            import gc
            import os

            seen = {"batch": batchId, "pid": os.getpid(), "frozen": gc.get_freeze_count()}
            with open(self.path, "a") as out:
                out.write(json.dumps(seen) + "\n")

    class RecordingSink(SinkFormat):
        @classmethod
        def name(cls) -> str:
            return "eos_gc_probe"

        def _writer(self, schema: StructType, overwrite: bool) -> Recorder:
            return Recorder(self.options["path"])

    log = tmp_path / "commits.jsonl"
    spark.dataSource.register(RecordingSink)
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 20)
        .load()
        .writeStream.format("eos_gc_probe")
        .option("path", str(log))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_for(
            lambda: log.exists() and len(log.read_text().splitlines()) >= batches,
            f"{batches} commits",
            timeout=60,
        )
    finally:
        query.stop()
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.cost(8)
def test_the_commit_process_keeps_its_imports_frozen_from_its_second_call(
    spark: SparkSession, tmp_path: Path
) -> None:
    commits = _commits_seen(spark, tmp_path, batches=6)
    by_process: dict[int, list[int]] = defaultdict(list)
    for seen in commits:
        by_process[seen["pid"]].append(seen["frozen"])
    reused = [frozen[1:] for frozen in by_process.values() if len(frozen) >= 3]
    assert reused, f"no commit process served three batches: {commits}"
    # From a process's second call its imports stay frozen; one call in REFREEZE thaws
    # them (a process the session's earlier queries used may reach it here).
    assert all(sum(f < 10_000 for f in later) <= 1 for later in reused), commits
