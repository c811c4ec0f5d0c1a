"""Sinks that commit when the batch completes."""

from sinks.postgres import PostgresDataSource

__all__ = ["PostgresDataSource"]
