"""The PostgreSQL sink ``eos_postgres``: exactly once through prepared transactions."""

from eos_connectors.sinks.postgres.at_least_once import PostgresAtLeastOnceWriter
from eos_connectors.sinks.postgres.exactly_once import PostgresExactlyOnceWriter
from eos_connectors.sinks.postgres.format import PostgresDataSource
from eos_connectors.sinks.postgres.options import PostgresSinkOptions, parse_options

__all__ = [
    "PostgresAtLeastOnceWriter",
    "PostgresDataSource",
    "PostgresExactlyOnceWriter",
    "PostgresSinkOptions",
    "parse_options",
]
