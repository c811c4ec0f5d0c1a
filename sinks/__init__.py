"""Sinks that commit when the batch completes.

Nothing is imported here: Spark's Python planner processes and task workers import
one sink's modules (``sinks.kafka``, say), and each of them would otherwise pay for
every other sink's client library too (psycopg alone is ~0.13 s).
"""

from __future__ import annotations

from typing import Any

__all__ = ["PostgresDataSource"]


def __getattr__(name: str) -> Any:
    if name == "PostgresDataSource":
        from eos_connectors.sinks.postgres import PostgresDataSource

        return PostgresDataSource
    raise AttributeError(f"module 'sinks' has no attribute {name!r}")
