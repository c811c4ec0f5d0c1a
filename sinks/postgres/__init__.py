"""The PostgreSQL sink ``eos_postgres``: exactly once through prepared transactions."""

from sinks.postgres.options import PostgresSinkOptions, parse_options
from sinks.postgres.source import PostgresDataSource
from sinks.postgres.writer import PostgresPlainWriter, PostgresTwoPhaseWriter

__all__ = [
    "PostgresDataSource",
    "PostgresPlainWriter",
    "PostgresSinkOptions",
    "PostgresTwoPhaseWriter",
    "parse_options",
]
