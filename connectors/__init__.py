"""eos-connectors: exactly-once Kafka, PostgreSQL and Redis connectors for PySpark.

What a Spark job imports::

    from eos_connectors import register
    register(spark)  # adds the formats eos_kafka, eos_postgres and eos_redis

The package's parts (installed as ``eos_connectors``; in the repository its folders
are ``connectors/``, ``sources/`` and ``sinks/``):

* ``core``: the runtime every connector runs on, inside the Spark job;
* ``sources.kafka`` and ``sinks.kafka`` / ``sinks.postgres`` / ``sinks.redis``: the
  connectors; ``formats``: the formats Spark knows them by;
* ``ops``: operator tools as a library (checkpoints, savepoints, state);
* ``cli``: the ``eos`` command;
* ``testing``: the kit that proves a sink exactly once (the ``testing`` extra);
* ``dev``: the local service stack, the harness and the benchmarks (development
  tooling: nothing above imports it).
"""

from eos_connectors._version import __version__
from eos_connectors.core.errors import (
    ConfigError,
    DataLossError,
    EosError,
    ServiceUnavailableError,
    StackError,
)
from eos_connectors.core.worker_path import drop_spark_jars, in_spark_worker
from eos_connectors.registry import register

# In a Spark Python worker (a data source's planning process, a task worker), the
# package is imported once the worker is set up: Spark's jar goes off the import path
# there, so each later task or call of a reused process skips re-reading it
# (core/worker_path.py).
if in_spark_worker():
    drop_spark_jars()

__all__ = [
    "ConfigError",
    "DataLossError",
    "EosError",
    "ServiceUnavailableError",
    "StackError",
    "__version__",
    "register",
]
