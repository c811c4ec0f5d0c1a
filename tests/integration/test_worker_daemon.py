"""Spark's Python workers fork from connectors.worker_daemon, with the task modules in,
and import PySpark compiled (connectors.spark_home)."""

from __future__ import annotations

import sys

import pytest
from pyspark.sql import SparkSession

from connectors.spark_home import installed_spark_home
from connectors.worker_daemon import PRELOAD

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
