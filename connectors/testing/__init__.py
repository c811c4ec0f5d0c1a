"""A test kit for connector authors: prove a two-phase sink exactly once without Spark.

* :class:`SinkContract`: the protocol's contract as a pytest base class; subclass it
  with your store (see ``examples/sqlite_sink``).
* :class:`MemorySink` / :func:`memory_server`: the in-memory reference store.
* :data:`CONTRACT_SCHEMA`, :func:`rows_of`: the rows the contract writes.

Then let ``eos verify`` (or the ``eos_verify`` pytest fixture) crash a real Spark
pipeline that writes to your sink.
"""

from eos_connectors.testing.contract import CONTRACT_SCHEMA, CRASH_POINTS, SinkContract, rows_of
from eos_connectors.testing.memory import MemoryServer, MemorySink, memory_server

__all__ = [
    "CONTRACT_SCHEMA",
    "CRASH_POINTS",
    "MemoryServer",
    "MemorySink",
    "SinkContract",
    "memory_server",
    "rows_of",
]
