"""``eos sinks`` over Kafka: sink ids from the marker groups and the marker log (driver-side
tooling).

A Kafka sink has nothing in doubt to settle: each task's transaction commits
itself, and one that never did is aborted by the next attempt's fencing or by
the broker after ``transaction.timeout.ms``. Its bookkeeping is one marker group
per task partition, ``<transactionalIdPrefix>-<sink id>-<partition>``, whose
committed offset is the next batch and whose metadata is the owner query's id, and
the same marker as a record keyed by the group's name in the compacted marker log.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Producer
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from connectors.errors import ServiceUnavailableError
from connectors.protocol import Lineage, TwoPhaseCommitWriter
from connectors.sinks_admin import Settled, SinkAdmin, SinkAdminError, SinkRecord
from connectors.topics import read_to_end
from sinks.kafka.marker_log import Marker, decode
from sinks.kafka.options import DEFAULT_MARKER_LOG

TIMEOUT = 30.0
log = logging.getLogger(__name__)


class KafkaSinkAdmin(SinkAdmin):
    store = "kafka"

    def __init__(
        self,
        client_config: dict[str, Any],
        transactional_id_prefix: str = "eos",
        marker_log: str = DEFAULT_MARKER_LOG,
    ) -> None:
        self.config = client_config
        self.marker_log = marker_log
        self.admin = AdminClient(client_config)
        self.group = re.compile(rf"^{re.escape(transactional_id_prefix)}-(.+)-(\d+)$")
        self.prefix = transactional_id_prefix

    def _groups(self) -> dict[str, list[str]]:
        """Sink id -> its marker groups that the broker still holds."""
        try:
            listed = self.admin.list_consumer_groups(request_timeout=TIMEOUT).result()
        except KafkaException as exc:
            raise ServiceUnavailableError(f"Listing Kafka's consumer groups: {exc}") from None
        return self._by_sink(listing.group_id for listing in listed.valid)

    def _by_sink(self, groups: Iterable[str]) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for group in groups:
            matched = self.group.match(group)
            if matched:
                found.setdefault(matched.group(1), []).append(group)
        return found

    def _log(self) -> dict[str, Marker]:
        """Marker group -> its last marker in the marker log (a tombstone forgets it).
        The log holds every marker a group ever had, also after the group's offsets
        expired or were deleted."""
        if self.marker_log not in self.admin.list_topics(timeout=TIMEOUT).topics:
            return {}
        settings = {k: v for k, v in self.config.items() if k != "bootstrap.servers"}
        records = read_to_end(self.config["bootstrap.servers"], self.marker_log,
                              settings=settings, timeout=TIMEOUT)  # fmt: skip
        markers: dict[str, Marker] = {}
        for record in records:
            group = (record.key or b"").decode(errors="replace")
            if not record.value:
                markers.pop(group, None)
                continue
            marker = decode(record.value)
            if marker is None:
                log.warning("%s offset %d (key %r) is not a sink marker: skipped",
                            self.marker_log, record.offset, group[:80])  # fmt: skip
                continue
            markers[group] = marker
        return markers

    def records(self) -> list[SinkRecord]:
        groups, log = self._groups(), self._log()
        logged = self._by_sink(log)
        return [
            self._record(sink, groups.get(sink, []), {g: log[g] for g in logged.get(sink, [])})
            for sink in sorted(set(groups) | set(logged))
        ]

    def _record(self, sink_id: str, groups: list[str], logged: dict[str, Marker]) -> SinkRecord:
        """A group's committed offset is its marker; the log's marker stands in for a
        group whose offsets are gone."""
        markers = dict(logged)
        for group in groups:
            request = ConsumerGroupTopicPartitions(group)
            future = self.admin.list_consumer_group_offsets([request])[group]
            for position in future.result().topic_partitions or []:
                if position.offset >= 0:
                    markers[group] = Marker(position.offset, position.metadata or "",
                                            position.topic)  # fmt: skip
        owners = sorted({m.query for m in markers.values()} - {""})
        owner = Lineage(" and ".join(owners)) if owners else None
        topics = ",".join(sorted({m.topic for m in markers.values()} - {""}))
        last = max(m.next_batch for m in markers.values()) - 1 if markers else None
        return SinkRecord(self.store, sink_id, owner, topics, last, ())

    def writer(self, record: SinkRecord) -> TwoPhaseCommitWriter:
        raise SinkAdminError("A Kafka sink has no units to settle with a writer.")

    def settle(self, sink_id: str) -> Settled:
        self.record(sink_id)
        return Settled((), ())

    def forget(self, sink_id: str) -> None:
        """Delete the marker groups and write a tombstone to the marker log for each
        group the log still holds a marker of."""
        groups = self._groups().get(sink_id, [])
        logged = self._by_sink(self._log()).get(sink_id, [])
        if logged:
            producer = Producer({**self.config, "enable.idempotence": True})
            for group in logged:
                producer.produce(self.marker_log, None, group.encode(), partition=0)
            if producer.flush(TIMEOUT):
                raise SinkAdminError(f"Could not write tombstones to {self.marker_log!r}.")
        if groups:
            deleted = self.admin.delete_consumer_groups(groups, request_timeout=TIMEOUT)
            for future in deleted.values():
                future.result()
