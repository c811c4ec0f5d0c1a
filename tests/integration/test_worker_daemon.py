"""Spark's Python workers fork from connectors.worker_daemon, with the task modules in."""

from __future__ import annotations

import sys

import pytest
from pyspark.sql import SparkSession

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
