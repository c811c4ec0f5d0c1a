"""A third-party sink written with the package's test kit: ``eos_sqlite`` (see sink.py)."""

from examples.sqlite_sink.sink import SqliteDataSource, SqliteWriter, counts

__all__ = ["SqliteDataSource", "SqliteWriter", "counts"]
