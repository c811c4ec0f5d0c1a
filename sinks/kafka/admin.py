"""``eos sinks`` over Kafka: sink ids from the marker consumer groups (driver-side tooling).

A Kafka sink has nothing in doubt to settle: each task's transaction commits
itself, and one that never did is aborted by the next attempt's fencing or by
the broker after ``transaction.timeout.ms``. Its bookkeeping is one marker group
per task partition, ``<transactionalIdPrefix>-<sink id>-<partition>``, whose
committed offset is the next batch and whose metadata is the owner query's id, and
the same marker as a record keyed by the group's name in the compacted marker log.
"""

from __future__ import annotations

import re
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, Producer
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from connectors.errors import ServiceUnavailableError
from connectors.protocol import Lineage, TwoPhaseCommitWriter
from connectors.sinks_admin import Settled, SinkAdmin, SinkAdminError, SinkRecord
from sinks.kafka.options import DEFAULT_MARKER_LOG

TIMEOUT = 30.0


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
        try:
            listed = self.admin.list_consumer_groups(request_timeout=TIMEOUT).result()
        except KafkaException as exc:
            raise ServiceUnavailableError(f"Listing Kafka's consumer groups: {exc}") from None
        groups: dict[str, list[str]] = {}
        for listing in listed.valid:
            found = self.group.match(listing.group_id)
            if found:
                groups.setdefault(found.group(1), []).append(listing.group_id)
        return groups

    def records(self) -> list[SinkRecord]:
        return [self._record(sink, groups) for sink, groups in sorted(self._groups().items())]

    def _record(self, sink_id: str, groups: list[str]) -> SinkRecord:
        requests = [ConsumerGroupTopicPartitions(g) for g in groups]
        owners: set[str] = set()
        topics: set[str] = set()
        done: list[int] = []
        for request in requests:
            future = self.admin.list_consumer_group_offsets([request])[request.group_id]
            for position in future.result().topic_partitions or []:
                if position.offset >= 0:
                    done.append(position.offset)
                    topics.add(position.topic)
                    owners.add(position.metadata or "")
        owner = Lineage(sorted(owners)[-1]) if owners - {""} else None
        if len(owners - {""}) > 1:
            owner = Lineage(" and ".join(sorted(owners - {""})))
        last = max(done) - 1 if done else None
        return SinkRecord(self.store, sink_id, owner, ",".join(sorted(topics)), last, ())

    def writer(self, record: SinkRecord) -> TwoPhaseCommitWriter:
        raise SinkAdminError("A Kafka sink has no units to settle with a writer.")

    def settle(self, sink_id: str) -> Settled:
        self.record(sink_id)
        return Settled((), ())

    def forget(self, sink_id: str) -> None:
        """Delete the marker groups and write a tombstone for each to the marker log."""
        groups = self._groups().get(sink_id, [])
        if not groups:
            return
        producer = Producer({**self.config, "enable.idempotence": True})
        for group in groups:
            producer.produce(self.marker_log, None, group.encode(), partition=0)
        if producer.flush(TIMEOUT):
            raise SinkAdminError(f"Could not write tombstones to {self.marker_log!r}.")
        deleted = self.admin.delete_consumer_groups(groups, request_timeout=TIMEOUT)
        for future in deleted.values():
            future.result()
