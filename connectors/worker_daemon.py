"""Spark's Python daemon with this package's task modules imported before it forks.

Spark starts one Python daemon per executor (``spark.python.daemon.module``, by
default ``pyspark.daemon``) and forks a Python worker from it for every task slot,
and again for each worker that died. Every new worker then imported pyarrow, pandas
(pyarrow loads it on its first conversion of Python objects: ~0.3-0.5 s in a
worker's first source task), confluent-kafka and the connectors: a cost paid at a
query's first batch and again after every restart, which is what recovery time
measures. Imported here once, before the forks, they are already in every worker
(and shared copy-on-write). Their objects are then frozen out of the garbage
collector (:func:`freeze`), which PySpark runs after every task. And Spark's jar,
which every task would otherwise read again, is taken off the import path first
(:mod:`eos_connectors.core.worker_path`).

Every session this package starts sets ``spark.python.daemon.module`` to this
module (``eos_connectors.ops.session.BASE_CONF``); a session of yours can set it too, on any
cluster where the package is installed next to PySpark.
"""

from __future__ import annotations

import gc
import importlib

from eos_connectors.core.worker_path import drop_spark_jars

#: What a task of this package imports. An optional one that is missing (pandas) is
#: left to the worker, which imports what it needs when it needs it.
PRELOAD = (
    "pandas",
    "pyarrow",
    "pyarrow.compute",
    "confluent_kafka",
    # The Arrow side of each connector: the writers and readers import these in write()
    # and read() only (Spark's driver-side processes load the writers without pyarrow),
    # so they are named here to be in every worker before its first task.
    "eos_connectors.sources.kafka.fetch",
    "eos_connectors.sinks.kafka.records",
    "eos_connectors.sinks.kafka.task_keys",
    "eos_connectors.sinks.postgres.copy",
    "eos_connectors.sinks.postgres.changes",
    "eos_connectors.sinks.redis.values",
    "eos_connectors.sources.kafka.stream_reader",
    "eos_connectors.sinks.kafka.exactly_once",
    "eos_connectors.sinks.kafka.batch_commit",
    "eos_connectors.sinks.kafka.at_least_once",
    "eos_connectors.sinks.postgres.exactly_once",
    "eos_connectors.sinks.postgres.at_least_once",
    "eos_connectors.sinks.redis.exactly_once",
    "eos_connectors.sinks.redis.at_least_once",
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


def freeze() -> None:
    """Move every object alive now out of the garbage collector's sight, for good.

    PySpark's daemon runs ``gc.collect()`` in a worker after every task it runs. A
    full collection walks every tracked object, and with pandas, pyarrow and the
    connectors imported there are ~105,000: 35-45 ms a collection on a quiet core
    and more on a busy one, paid by every task, since the worker cannot take its
    next task before it finishes. Frozen before the fork, the imported modules'
    objects are never walked again (and their pages stay shared with the daemon,
    as ``gc.freeze`` is meant for); the collection after a task walks only what
    the task left."""
    gc.collect()
    gc.freeze()


if __name__ == "__main__":
    drop_spark_jars()  # before the fork: no task of a worker re-reads Spark's jar
    preload()
    freeze()
    from pyspark.daemon import manager

    manager()  # type: ignore[no-untyped-call]  # untyped in PySpark 4.0
