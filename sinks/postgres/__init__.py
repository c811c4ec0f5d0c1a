"""The PostgreSQL sink ``eos_postgres``: exactly once through prepared transactions."""

from eos_connectors.sinks.postgres.options import PostgresSinkOptions, parse_options
from eos_connectors.sinks.postgres.source import PostgresDataSource
from eos_connectors.sinks.postgres.writer import (
    PostgresAtLeastOnceWriter,
    PostgresExactlyOnceWriter,
)

__all__ = [
    "PostgresAtLeastOnceWriter",
    "PostgresDataSource",
    "PostgresExactlyOnceWriter",
    "PostgresSinkOptions",
    "parse_options",
]
