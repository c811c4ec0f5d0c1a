"""A sink whose tasks never finish: the harness must report a stalled pipeline."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType


class StuckWriter(DataSourceStreamWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        time.sleep(3600)
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class StuckSink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "stuck"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return StuckWriter()
