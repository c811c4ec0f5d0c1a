"""Spark's Python daemon with this package's task modules imported before it forks.

Spark starts one Python daemon per executor (``spark.python.daemon.module``, by
default ``pyspark.daemon``) and forks a Python worker from it for every task slot,
and again for each worker that died. Every new worker then imported pyarrow, pandas
(pyarrow loads it on its first conversion of Python objects: ~0.3-0.5 s in a
worker's first source task), confluent-kafka and the connectors: a cost paid at a
query's first batch and again after every restart, which is what recovery time
measures. Imported here once, before the forks, they are already in every worker
(and shared copy-on-write).

Every session this package starts sets ``spark.python.daemon.module`` to this
module (``connectors.spark.BASE_CONF``); a session of yours can set it too, on any
cluster where the package is installed next to PySpark.
"""

from __future__ import annotations

import importlib

#: What a task of this package imports. An optional one that is missing (pandas) is
#: left to the worker, which imports what it needs when it needs it.
PRELOAD = (
    "pandas",
    "pyarrow",
    "pyarrow.compute",
    "confluent_kafka",
    "sources.kafka.reader",
    "sinks.kafka.writer",
    "sinks.postgres.writer",
    "sinks.redis.writer",
)


def preload() -> list[str]:
    """Import :data:`PRELOAD`; the names that could not be imported."""
    missing = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


if __name__ == "__main__":
    preload()
    from pyspark.daemon import manager

    manager()
