"""The parts of PySpark's data source API that differ between the supported releases (4.0-4.3).

Everything else of the package runs one code path on every release. Two things differ:

- **Arrow stream writers** (``DataSourceStreamArrowWriter``, new in 4.1). PySpark 4.0
  hands a writer Arrow record batches when it is a ``DataSourceArrowWriter`` (the
  batch writers' class) and ``Row`` objects otherwise, streaming or not; so on 4.0
  :class:`StreamArrowWriter` is a stream writer that is also an Arrow writer, and its
  tasks get the same record batches as on 4.1+, with no conversion to rows.
- **Admission control** (``pyspark.sql.streaming.datasource``: read limits and
  ``SupportsTriggerAvailableNow``, new in 4.2). Before 4.2 Spark calls a stream
  reader's ``latestOffset()`` with no start and no limit, and runs ``availableNow``
  as one batch up to the end it saw first. :data:`HAS_READ_LIMITS` says which; the
  read-limit classes below stand in on 4.0-4.1 so that one reader's code names them.

Taking on a new release (4.4): run ``make spark-matrix`` with it added to
``SPARK_RELEASES``; a difference that fails there gets a named shim here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyspark
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamWriter

if TYPE_CHECKING:
    from collections.abc import Iterator

    from pyarrow import RecordBatch
    from pyspark.sql.datasource import WriterCommitMessage

#: ``major.minor`` of the PySpark this process runs, e.g. ``(4, 1)``.
SPARK_MINOR: tuple[int, int] = tuple(int(p) for p in pyspark.__version__.split(".")[:2])  # type: ignore[assignment]

# Type checking sees the stand-ins on every release, so that mypy passes against the
# lowest release (CI's) and the highest alike; they have what the package uses of
# PySpark's classes.
if not TYPE_CHECKING and SPARK_MINOR >= (4, 2):
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    HAS_READ_LIMITS = True
else:  # PySpark 4.0-4.1: the names the reader uses; Spark never hands it a limit

    class ReadLimit:
        """Stand-in for PySpark 4.2's ``ReadLimit`` (never passed by 4.0-4.1)."""

    class ReadAllAvailable(ReadLimit):
        """Stand-in for PySpark 4.2's ``ReadAllAvailable``."""

    class ReadMaxRows(ReadLimit):
        """Stand-in for PySpark 4.2's ``ReadMaxRows``."""

        def __init__(self, max_rows: int) -> None:
            self.max_rows = max_rows

    class SupportsTriggerAvailableNow:
        """Stand-in for PySpark 4.2's mixin (4.0-4.1 never call its hook)."""

    HAS_READ_LIMITS = SPARK_MINOR >= (4, 2)  # False at run time; unknown to mypy

if TYPE_CHECKING:  # what mypy sees on every release: PySpark 4.1+'s class

    class StreamArrowWriter(DataSourceStreamWriter):
        """A stream writer that Spark hands Arrow record batches."""

        def write(self, iterator: Iterator[RecordBatch]) -> WriterCommitMessage:  # type: ignore[override]
            ...

elif SPARK_MINOR >= (4, 1):
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as StreamArrowWriter
else:  # PySpark 4.0

    class StreamArrowWriter(DataSourceStreamWriter, DataSourceArrowWriter):  # type: ignore[misc]
        """PySpark 4.0: a stream writer that 4.0's worker hands Arrow record batches
        (it checks for ``DataSourceArrowWriter``), as 4.1+ does a
        ``DataSourceStreamArrowWriter``."""


def release() -> str:
    """The PySpark release this process runs, for messages."""
    return pyspark.__version__


__all__ = [
    "HAS_READ_LIMITS",
    "SPARK_MINOR",
    "ReadAllAvailable",
    "ReadLimit",
    "ReadMaxRows",
    "StreamArrowWriter",
    "SupportsTriggerAvailableNow",
    "release",
]
