"""Task side: the at-least-once PostgreSQL sink (``deliveryGuarantee=at-least-once``): each
task commits its own transaction, and a replayed batch writes again."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import WriterCommitMessage

from eos_connectors.core.continuous import refuse_continuous
from eos_connectors.core.spark_api import StreamArrowWriter
from eos_connectors.sinks.postgres.connection import allowing, give_back, take
from eos_connectors.sinks.postgres.options import PostgresSinkOptions
from eos_connectors.sinks.postgres.rows import ControlTypes, TaskRows

if TYPE_CHECKING:
    import pyarrow as pa


class PostgresAtLeastOnceWriter(StreamArrowWriter):
    """At-least-once: each task commits its own transaction; a replayed batch writes again.

    With mode=upsert a replay rewrites the same rows (idempotent in effect); with
    mode=append it duplicates them. For benchmarks and stores that tolerate it.
    """

    def __init__(
        self,
        options: PostgresSinkOptions,
        columns: tuple[str, ...],
        control_types: ControlTypes = (),
        checkpoint: str | None = None,
    ) -> None:
        self.options = options
        self.rows = TaskRows(options, columns, control_types)
        self.checkpoint_location = checkpoint  # driver only: refuse_continuous

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        name = f"plain|{context.partitionId() if context else 0}"
        conn = take(self.options)
        try:
            seconds = self.options.statement_seconds
            with allowing(conn, seconds), conn.transaction(), conn.cursor() as cur:
                self.rows.write(cur, name, iterator)
        except BaseException:
            conn.close()
            raise
        give_back(self.options, conn)
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: nothing to do (each task wrote its own rows) but refuse an epoch of
        continuous processing (:mod:`eos_connectors.core.continuous`)."""
        refuse_continuous(messages, batchId, self.checkpoint_location, "eos_postgres")
