"""Warming Spark up before a test or a harness run needs it (development tooling).

Two things make a fresh pipeline process slow to its first batch: the driver JVM
loading and verifying Spark's classes (~12 s on 2 cores), and the first query
starting PySpark's worker daemons. :func:`ensure_class_archive` records the
classes a pipeline of this package loads into a class-data-sharing archive once
per machine (the session of :mod:`eos_connectors.ops.session` maps it: ~6 s);
:func:`warm_up` runs a small query through every kind of stage so a standby
pipeline is warm before the harness hands it a real one.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eos_connectors.core.errors import EosError
from eos_connectors.dev.harness.pipeline import running_count_processor
from eos_connectors.ops.cache import building
from eos_connectors.ops.session import (
    BASE_CONF,
    QUIET_CDS,
    TASK_ATTEMPTS,
    class_archive_path,
    start_classic,
    with_java_option,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def ensure_class_archive(timeout: float = 300.0) -> Path | None:
    """Build the archive once (about 25 s); None when building it failed (Spark then
    starts without it: slower, never wrong). Safe to call from concurrent processes."""
    archive = class_archive_path()
    if archive.exists() or os.environ.get("EOS_SPARK_CLASS_ARCHIVE") == "0":
        return archive if archive.exists() else None
    archive.parent.mkdir(parents=True, exist_ok=True)
    with building(archive.with_suffix(".lock")):
        if archive.exists():
            return archive
        with tempfile.TemporaryDirectory(dir=archive.parent) as work:
            partial = Path(work) / archive.name
            command = [sys.executable, "-m", __name__, str(partial)]
            env = {**os.environ, "EOS_SPARK_CLASS_ARCHIVE": "0"}
            try:
                subprocess.run(command, env=env, timeout=timeout, check=True, capture_output=True)
            except (subprocess.SubprocessError, OSError) as exc:
                print(
                    f"eos: building Spark's class archive failed ({exc}); Spark starts without it",
                    file=sys.stderr,
                )
                return None
            if not partial.exists():
                return None
            partial.replace(archive)
    return archive


def _archive_workload(out: Path) -> None:
    """Run what the package's pipelines run (Python data sources, a stateful stage on
    RocksDB, a Python streaming writer), then exit: the JVM writes the classes it
    loaded to ``out`` as it exits."""
    settings = with_java_option(dict(BASE_CONF), f"-XX:ArchiveClassesAtExit={out} {QUIET_CDS}")
    spark = start_classic("eos-cds", f"local[2,{TASK_ATTEMPTS}]", settings)
    spark.sparkContext.setLogLevel("ERROR")
    from eos_connectors.registry import register

    register(spark)
    warm_up(spark, stateful_processor=True)
    spark.stop()
    _wait_for_jvm_exit()


def warm_up(spark: SparkSession, stateful_processor: bool = False) -> None:
    """Run a small streaming query through a Python source, an aggregation and a Python
    sink (and a ``transformWithStateInPandas`` one), so the JVM has loaded their classes
    and started PySpark's worker daemons before a real query needs them (about 12 s
    on a 2-core machine)."""
    spark.dataSource.register(_warm_up_source())
    with tempfile.TemporaryDirectory() as work:
        words = spark.readStream.format("eos_warm_up").load()
        frames = [("count", words.groupBy("word").count(), "complete")]
        if stateful_processor:
            processed = words.groupBy("word").transformWithStateInPandas(
                statefulProcessor=running_count_processor(),
                outputStructType="word string, count long, delta long",
                outputMode="Append",
                timeMode="None",
            )
            frames.append(("state", processed, "append"))
        for name, frame, mode in frames:
            query = (
                frame.writeStream.format("eos_warm_up")
                .outputMode(mode)
                .option("checkpointLocation", f"{work}/{name}")
                .trigger(availableNow=True)
                .queryName(f"eos-warm-up-{name}")
                .start()
            )
            query.awaitTermination(120)


def _wait_for_jvm_exit(timeout: float = 120.0) -> None:
    """Close the gateway JVM's stdin (it exits on that) and wait: the archive is written
    while the JVM exits, after this Python process would otherwise be gone."""
    from pyspark import SparkContext

    process = getattr(SparkContext._gateway, "proc", None)
    if process is None:
        return
    with contextlib.suppress(OSError):
        process.stdin.close()
    process.wait(timeout)


class _WarmUpReader:  # the methods PySpark's DataSourceStreamReader calls
    def initialOffset(self) -> dict[str, int]:
        return {"offset": 0}

    def latestOffset(self) -> dict[str, int]:
        return {"offset": 2}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
        from pyspark.sql.datasource import InputPartition

        return [InputPartition(i) for i in range(start["offset"], end["offset"])]

    def read(self, partition: Any) -> Iterator[tuple[str]]:
        yield from ((f"w{i % 7}",) for i in range(100))

    def commit(self, end: dict[str, int]) -> None:
        pass


def _warm_up_source() -> Any:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceStreamReader,
        DataSourceStreamWriter,
        WriterCommitMessage,
    )

    class Reader(_WarmUpReader, DataSourceStreamReader):  # type: ignore[misc]
        pass

    class Writer(DataSourceStreamWriter):  # type: ignore[misc]
        def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
            for _ in iterator:
                pass
            return WriterCommitMessage()

        def commit(self, messages: list[Any], batchId: int) -> None:
            pass

    class Source(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "eos_warm_up"

        def schema(self) -> str:
            return "word string"

        def streamReader(self, schema: Any) -> Any:
            return Reader()

        def streamWriter(self, schema: Any, overwrite: bool) -> Any:
            return Writer()

    return Source


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(EosError("usage: python -m eos_connectors.dev.warm_up ARCHIVE_PATH"))
    _archive_workload(Path(sys.argv[1]))
