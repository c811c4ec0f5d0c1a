"""``eos_kafka`` as a sink: its writing half (the format, with the source's reading half,
is :class:`eos_connectors.formats.KafkaDataSource`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceStreamWriter
from pyspark.sql.types import StructType

from eos_connectors.core import batch_job
from eos_connectors.core.at_once import at_once
from eos_connectors.core.changes import check_schema as check_changes
from eos_connectors.core.checkpoint_sinks import (
    checkpoint_files,
    checkpoint_location,
    last_planned,
)
from eos_connectors.core.errors import EosError
from eos_connectors.core.startup import once_per_driver, start_key

if TYPE_CHECKING:
    from eos_connectors.sinks.kafka import KafkaAtLeastOnceWriter, KafkaExactlyOnceWriter
    from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter
    from eos_connectors.sinks.kafka.options import KafkaSinkOptions

NAME = "the eos_kafka sink"

log = logging.getLogger(__name__)


class KafkaSinkFormat(batch_job.SinkFormat):
    """``eos_kafka``'s writing half: Spark's Kafka sink columns and options, written in one
    fenced, marked transaction per task, which the driver commits once the batch is decided
    (:mod:`eos_connectors.sinks.kafka.batch_commit`) or, with ``commitMode=task``, the task
    itself (:mod:`eos_connectors.sinks.kafka.exactly_once`)."""

    connector = NAME
    instead_of_overwrite = (
        "a Kafka topic is appended to, never rewritten (Spark's sink refuses it too)"
    )

    @property
    def sink_config(self) -> KafkaSinkOptions:
        from eos_connectors.sinks.kafka import parse_options as parse_sink_options

        return parse_sink_options(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Driver: as every sink's; an exactly-once stream then takes its sink id's claim,
        once, before any task runs (:func:`~eos_connectors.sinks.kafka.claim.claim_at_start`:
        its first tasks would otherwise all claim at once), and in the batch commit its
        decider (:func:`~eos_connectors.sinks.kafka.stream_decider.claim_at_start`: a driver
        of an earlier run is fenced before the first batch). After the start checks, never
        beside them: the claim reads and writes the output topic's partition 0 and the
        marker log, which the checks find or create, and a query refused at its start
        must not hold it."""
        writer = super().streamWriter(schema, overwrite)
        options = self.sink_config
        if options.exactly_once:
            from eos_connectors.sinks.kafka.claim import claim_at_start

            once_per_driver(
                start_key("eos_kafka-claim", self.options, schema),
                lambda: claim_at_start(options, checkpoint_location(self.options)),
            )
        if options.exactly_once and options.commit_mode == "batch":
            from eos_connectors.sinks.kafka import stream_decider

            once_per_driver(
                start_key("eos_kafka-decider", self.options, schema),
                lambda: stream_decider.claim_at_start(options, checkpoint_location(self.options)),
            )
        return writer

    def _writer(
        self, schema: StructType, overwrite: bool
    ) -> KafkaExactlyOnceWriter | KafkaAtLeastOnceWriter | BatchCommitWriter:
        from eos_connectors.sinks.kafka import KafkaAtLeastOnceWriter, KafkaExactlyOnceWriter
        from eos_connectors.sinks.kafka.checks import start_checks
        from eos_connectors.sinks.kafka.columns import check_schema

        options = self.sink_config
        check_schema(schema, has_topic_option=options.topic is not None)
        check_changes(options.changes, schema, ("key",), NAME)

        def check() -> None:
            once_per_driver(
                start_key("eos_kafka", self.options, schema),
                lambda: start_checks(options, self.options),
            )

        if options.exactly_once and options.commit_mode == "batch":
            from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter

            _, timed = at_once(check, lambda: self._batch_commit_start(options, schema))
            log.info("eos_kafka: commitMode=batch (the driver commits each batch's transactions)")
            return BatchCommitWriter(timed, checkpoint_location(self.options))
        check()
        if options.exactly_once:
            log.warning(
                "eos_kafka: commitMode=task, the fallback: each task commits its own "
                "transaction, visible before the batch completes; exactly once needs "
                "deterministic replay (docs/kafka-sink.md)"
            )
            location = checkpoint_location(self.options)
            return KafkaExactlyOnceWriter(options, location, planned_at(location))
        return KafkaAtLeastOnceWriter(options, checkpoint_location(self.options))

    def _batch_commit_start(
        self, options: KafkaSinkOptions, schema: StructType
    ) -> KafkaSinkOptions:
        """Driver, beside the start checks: the options with the broker's transaction
        timeout (:func:`~eos_connectors.sinks.kafka.checks.with_broker_timeout`), once the
        driver's transaction client is found to reach the coordinators."""
        from eos_connectors.sinks.kafka.batch_commit import check_start
        from eos_connectors.sinks.kafka.checks import with_broker_timeout

        timed = with_broker_timeout(options, self.options)
        once_per_driver(
            start_key("eos_kafka-batch-commit", self.options, schema),
            lambda: check_start(timed),
        )
        return timed


def planned_at(location: str | None) -> tuple[int, str] | None:
    """Driver, as Spark makes a stream's writer for a batch (after it wrote that batch's
    ``offsets/N``): the checkpoint's last planned batch and its source positions' digest,
    for the ``commitMode=task`` markers (a listing and one file read); None when the
    checkpoint cannot be read (an error logged once per checkpoint: the digest is a
    second guard, never a reason to fail a batch)."""
    files = checkpoint_files(location)
    if files is None:
        return None
    try:
        last, digest = last_planned(files)
    except (OSError, EosError) as exc:
        if location not in _UNREAD:
            _UNREAD.add(location)
            log.warning("could not read the offsets of checkpoint %s: %s", location, exc)
        return None
    return (last, digest) if digest else None


#: Checkpoints whose offsets could not be read (warned of once).
_UNREAD: set[str | None] = set()
