"""Spark's Python workers fork from eos_connectors.worker_daemon, with the task modules in,
import PySpark compiled (eos_connectors.ops.spark_home) and have Spark's jar off their
import path (eos_connectors.core.worker_path)."""

from __future__ import annotations

import sys

import pytest
from pyspark.sql import SparkSession

from eos_connectors.core import spark_api
from eos_connectors.ops.spark_home import installed_spark_home
from eos_connectors.worker_daemon import PRELOAD

pytestmark = pytest.mark.spark


def test_workers_start_with_the_task_modules_imported(spark: SparkSession) -> None:
    """A plain RDD map imports none of them; they are there because the daemon imported
    them before it forked the worker."""
    names = list(PRELOAD)  # pickled with the function, which is pickled by value

    def loaded(_: object) -> list[str]:  # in a Python worker, before it imported them
        return [name for name in names if name in sys.modules]

    found = spark.sparkContext.parallelize(range(2), 2).map(loaded).collect()
    assert found == [names, names]


def test_python_processes_import_pyspark_compiled(spark: SparkSession) -> None:
    """Spark puts SPARK_HOME's python/lib/pyspark.zip first on the path of every Python
    process it starts; the linked home has none, so a task worker and a planner (here
    the process that creates a data source) import the installed PySpark, compiled."""
    from pyspark.sql.datasource import DataSource

    class PlannerProbe(DataSource):  # defined here: pickled by value
        @classmethod
        def name(cls) -> str:
            return "eos_planner_probe"

        def schema(self) -> str:  # runs in a planner process
            import pyspark

            return f"`{pyspark.__file__}` string"

    def origin(_: object) -> str:
        import pyspark

        return pyspark.__file__

    workers = spark.sparkContext.parallelize(range(2), 2).map(origin).collect()
    spark.dataSource.register(PlannerProbe)
    planner = spark.read.format("eos_planner_probe").load().columns[0]
    expected = str(installed_spark_home() / "__init__.py")
    assert [*workers, planner] == [expected] * 3


def test_no_task_nor_planner_reads_sparks_jar_again(spark: SparkSession) -> None:
    """Spark puts its core jar on every Python process's path, and PySpark invalidates
    the import caches at every task and planning call, which on Python 3.11-3.12 reads
    the jar's ~5,300-entry directory again (~50-120 ms of CPU a task). A task worker
    (the daemon dropped the jar before the fork) and a planner process (the package
    drops it on import) have no jar left on the path, so no archive is read."""
    from pyspark.sql.datasource import DataSource

    def jars_and_reads() -> str:
        import importlib
        import sys
        import zipimport

        read = zipimport._read_directory  # type: ignore[attr-defined]
        reads: list[str] = []

        def counted(archive: str) -> object:
            reads.append(archive)
            return read(archive)

        zipimport._read_directory = counted  # type: ignore[attr-defined]
        try:
            importlib.invalidate_caches()
        finally:
            zipimport._read_directory = read  # type: ignore[attr-defined]
        return f"{sum(p.endswith('.jar') for p in sys.path)}:{len(reads)}"

    class JarProbe(DataSource):  # defined here: pickled by value
        @classmethod
        def name(cls) -> str:
            return "eos_jar_probe"

        def schema(self) -> str:  # runs in a planner process, which imports the package
            import eos_connectors  # noqa: F401

            return f"`{jars_and_reads()}` string"

    workers = spark.sparkContext.parallelize(range(2), 2).map(lambda _: jars_and_reads()).collect()
    spark.dataSource.register(JarProbe)
    planner = spark.read.format("eos_jar_probe").load().columns[0]
    expected = "0:0" if sys.version_info < (3, 13) else "1:0"  # 3.13+: no read, jar kept
    assert [*workers, planner] == [expected] * 3


def test_workers_start_with_the_imported_objects_frozen_out_of_the_collector(
    spark: SparkSession,
) -> None:
    """PySpark collects garbage in a worker after every task: with the imports frozen
    (gc.freeze before the fork) it walks only what tasks left, not ~100,000 objects."""

    def frozen_and_tracked(_: object) -> tuple[int, int]:
        import gc

        gc.collect()  # as after a task: what it leaves is what a collection walks
        return gc.get_freeze_count(), len(gc.get_objects())

    found = spark.sparkContext.parallelize(range(2), 2).map(frozen_and_tracked).collect()
    assert all(frozen > 50_000 and tracked < frozen // 4 for frozen, tracked in found), found


@pytest.mark.newer_spark
@pytest.mark.skipif(
    spark_api.SPARK_MINOR < (4, 1), reason="PySpark 4.0 has no Unix domain sockets (4.1+)"
)
def test_workers_talk_to_spark_over_a_unix_socket(spark: SparkSession) -> None:
    """spark.python.unix.domain.socket.enabled (eos_connectors.ops.session.BASE_CONF): a task's
    hand-over to its worker and back skips the loopback TCP stack (PySpark 4.1+; 4.0
    ignores the setting and talks TCP on loopback)."""

    def unix(_: object) -> str | None:
        import os

        return os.environ.get("PYTHON_UNIX_DOMAIN_ENABLED", "").lower()

    assert spark.sparkContext.parallelize(range(2), 2).map(unix).collect() == ["true", "true"]
