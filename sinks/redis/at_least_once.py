"""Task side: the at-least-once Redis sink (``deliveryGuarantee=at-least-once``): each task
writes straight to the keys, and a replayed batch writes again."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pyspark.sql.datasource import WriterCommitMessage

from eos_connectors.core.continuous import refuse_continuous
from eos_connectors.core.spark_api import StreamArrowWriter
from eos_connectors.sinks.redis import layout, scripts
from eos_connectors.sinks.redis.connection import pooled
from eos_connectors.sinks.redis.exactly_once import ENTRIES_PER_COMMAND, log_absent, script_args
from eos_connectors.sinks.redis.options import RedisSinkOptions

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)


class RedisAtLeastOnceWriter(StreamArrowWriter):
    """At-least-once: each task writes its entries straight to their keys.

    A replayed batch writes again: harmless in upsert mode, counted twice in
    increment mode. For benchmarks and for data that tolerates it.
    """

    def __init__(
        self, options: RedisSinkOptions, spec: layout.Layout, checkpoint: str | None = None
    ) -> None:
        self.options = options
        self.spec = spec
        self.checkpoint_location = checkpoint  # driver only: refuse_continuous

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        from eos_connectors.sinks.redis.values import entries  # pyarrow: tasks only

        flat, _ = entries(self.spec, iterator)
        client = pooled(self.options)
        apply = client.register_script(scripts.APPLY_ENTRIES)
        head = script_args(self.spec, self.options.ttl_seconds)
        chunk = ENTRIES_PER_COMMAND * self.spec.stride
        with client.pipeline(transaction=False) as pipe:
            for start in range(0, len(flat), chunk):
                apply(args=[*head, *flat[start : start + chunk]], client=pipe)
            results = pipe.execute()
        failed = sum(int(r[1]) for r in results)
        if failed:
            log.error(
                "Redis refused %d writes of this task (a key of another type, or a value "
                "that is no number)",
                failed,
            )
        log_absent(sum(int(r[2]) for r in results), "this task")
        return WriterCommitMessage()

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Driver: nothing to do (each task wrote its own rows) but refuse an epoch of
        continuous processing (:mod:`eos_connectors.core.continuous`)."""
        refuse_continuous(messages, batchId, self.checkpoint_location, "eos_redis")
