"""``eos sinks`` over Kafka: sink ids from the marker groups and the marker log (driver-side
tooling).

A Kafka sink has nothing in doubt to settle: each task's transaction commits
itself, and one that never did is aborted by the next attempt's fencing or by
the broker after ``transaction.timeout.ms``. Its bookkeeping is one marker group
per task partition, ``<transactionalIdPrefix>-<sink id>-<partition>``, whose
committed offset is the next batch and whose metadata is the owner query's id, and
the same marker as a record keyed by the group's name in the compacted marker log;
and the sink's claim (:mod:`sinks.kafka.claim`), ``<prefix>-<sink id>-claim``. A sink
in ``commitMode=batch`` also has its decision pointer and record
(:mod:`sinks.kafka.decisions`), ``<prefix>-<sink id>-decision``, listed and cleared
like a marker.

A reset first aborts the sink's open transactions (a batch-commit attempt's id carries
its attempt slot, so no group's fencing below ends it), then takes each of them in turn
the way a task does: ``init_transactions()`` of
its transactional id fences whatever producer a live query still has and ends its
open transaction; the marker is then read stably, checked against the reset's
guard, and cleared in a transaction of that producer (offset 0 with no query, and
a tombstone in the log). A task of the old query that wakes later is fenced, and
its next producer finds a cleared marker and an unclaimed (or another query's)
sink id.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Iterable
from typing import Any

from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]

from eos_connectors.core.errors import ServiceUnavailableError, keeping_code
from eos_connectors.core.kafka_config import QUIET_LOG
from eos_connectors.core.protocol import Lineage, TwoPhaseCommitWriter
from eos_connectors.core.sinks_admin import (
    ResetGuard,
    Settled,
    SinkAdmin,
    SinkAdminError,
    SinkRecord,
    refuse,
)
from eos_connectors.core.topics import read_to_end
from eos_connectors.sinks.kafka.decisions import DECISION_SUFFIX, Decision
from eos_connectors.sinks.kafka.jobs import JOB_SUFFIX, put_record
from eos_connectors.sinks.kafka.marker_log import Marker, decode
from eos_connectors.sinks.kafka.options import DEFAULT_MARKER_LOG

TIMEOUT = 30.0
#: Seconds the admin waits for Kafka's first answer before it says Kafka is unreachable.
REACH_TIMEOUT = 10.0
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
        settings: dict[str, Any] = {**client_config, "logger": QUIET_LOG}
        self.admin = AdminClient(settings)
        self._reach(str(client_config.get("bootstrap.servers", "")))
        self.group = re.compile(
            rf"^{re.escape(transactional_id_prefix)}-(.+)-(\d+|claim|decision)$"
        )
        self.prefix = transactional_id_prefix

    def _reach(self, bootstrap: str) -> None:
        """Kafka answers within :data:`REACH_TIMEOUT`, or one clear error says it does
        not (rather than every call waiting out its own timeout)."""
        try:
            self.admin.list_topics(timeout=REACH_TIMEOUT)
        except KafkaException as exc:
            raise keeping_code(
                ServiceUnavailableError(
                    f"Kafka at {bootstrap} did not answer within {REACH_TIMEOUT:.0f} s "
                    f"({exc.args[0].str() if exc.args else exc}). Check EOS_KAFKA_BOOTSTRAP "
                    "(and EOS_KAFKA_CONFIG for a secured listener), or unset it to "
                    "leave Kafka out."
                ),
                exc,
            ) from None

    def _groups(self) -> dict[str, list[str]]:
        """Sink id -> its marker groups that the broker still holds."""
        try:
            listed = self.admin.list_consumer_groups(request_timeout=TIMEOUT).result()
        except KafkaException as exc:
            raise keeping_code(
                ServiceUnavailableError(f"Listing Kafka's consumer groups: {exc}"), exc
            ) from None
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
        expired or were deleted. Also sets :attr:`_written`: group -> the broker's time of
        its last record (seconds since the epoch); and :attr:`_decided_over`: a decision
        group, or a ``commitMode=task`` marker group, -> its last decision's or marker's
        batch and source positions' digest."""
        self._written: dict[str, float] = {}
        self._decided_over: dict[str, tuple[int, str]] = {}
        if self.marker_log not in self.admin.list_topics(timeout=TIMEOUT).topics:
            return {}
        records = read_to_end(self.config, self.marker_log, timeout=TIMEOUT)
        markers: dict[str, Marker] = {}
        self._jobs: set[str] = set()
        for record in records:
            group = (record.key or b"").decode(errors="replace")
            if group.endswith(JOB_SUFFIX):  # a batch job's record (sinks.kafka.jobs)
                if record.value:
                    self._jobs.add(group)
                else:
                    self._jobs.discard(group)
                continue
            self._written[group] = record.timestamp / 1000
            if not record.value:
                markers.pop(group, None)
                self._decided_over.pop(group, None)
                continue
            marker = None
            if group.endswith(DECISION_SUFFIX):
                marker = self._decision_marker(group, record.value)
            marker = marker or self._task_marker(group, record.value)
            if marker is None:
                log.warning(
                    "%s offset %d (key %r) is not a sink marker: skipped",
                    self.marker_log,
                    record.offset,
                    group[:80],
                )
                continue
            markers[group] = marker
        return markers

    def _decision_marker(self, group: str, value: bytes) -> Marker | None:
        """A batch-commit sink's decision record as a marker: its next batch and query (the
        pointer group's own offset names the topic); its digest noted in
        :attr:`_decided_over`."""
        decision = Decision.decode(value)
        if decision is None:
            return None
        self._decided_over[group] = (decision.batch, decision.offsets)
        return Marker(decision.batch + 1, decision.query, "")

    def _task_marker(self, group: str, value: bytes) -> Marker | None:
        """A record's marker (a task partition's, or a claim); the digest a
        ``commitMode=task`` marker kept noted in :attr:`_decided_over`."""
        marker = decode(value)
        if marker is not None and marker.offsets:
            self._decided_over[group] = (marker.next_batch - 1, marker.offsets)
        return marker

    def records(self) -> list[SinkRecord]:
        return self._records(None)

    def find(self, sink_id: str) -> SinkRecord | None:
        return next(iter(self._records(sink_id)), None)

    def _records(self, only: str | None) -> list[SinkRecord]:
        """Every sink id's record, or ``only``'s: the groups' offsets are asked for all at
        once (one request a group, answered concurrently), not one after another."""
        groups, log = self._groups(), self._log()
        logged = self._by_sink(log)
        sinks = sorted(set(groups) | set(logged)) if only is None else [only]
        offsets = self._offsets([g for sink in sinks for g in groups.get(sink, [])])
        found = [
            self._record(
                sink,
                {g: offsets[g] for g in groups.get(sink, [])},
                {g: log[g] for g in logged.get(sink, [])},
            )
            for sink in sinks
        ]
        return [r for r in found if r.owner is not None or r.last_decided is not None]

    def _offsets(self, groups: list[str]) -> dict[str, list[Any]]:
        """Group -> its committed offsets (TopicPartitions)."""
        futures = {
            group: self.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[
                group
            ]
            for group in groups
        }
        return {group: future.result().topic_partitions or [] for group, future in futures.items()}

    def _record(
        self, sink_id: str, groups: dict[str, list[Any]], logged: dict[str, Marker]
    ) -> SinkRecord:
        """A group's committed offset is its marker; the log's marker stands in for a
        group whose offsets are gone."""
        markers = dict(logged)
        for group, positions in groups.items():
            for position in positions:
                if position.offset >= 0:
                    markers[group] = Marker(
                        position.offset, position.metadata or "", position.topic
                    )
        markers = {g: m for g, m in markers.items() if m.query or m.next_batch}  # not cleared
        owners = sorted({m.query for m in markers.values()} - {""})
        owner = Lineage(" and ".join(owners)) if owners else None
        topics = ",".join(sorted({m.topic for m in markers.values()} - {""}))
        batches = [m.next_batch - 1 for g, m in markers.items() if not g.endswith("-claim")]
        written = [self._written[g] for g in markers if g in self._written]
        idle = time.time() - max(written) if written else None
        last = max(batches, default=None)
        over = [o for g, (b, o) in self._decided_over.items() if g in logged and b == last]
        return SinkRecord(self.store, sink_id, owner, topics, last, (), idle, next(iter(over), ""))

    def writer(self, record: SinkRecord) -> TwoPhaseCommitWriter:
        raise SinkAdminError("A Kafka sink has no units to settle with a writer.")

    def settle(self, sink_id: str) -> Settled:
        self.record(sink_id)
        return Settled((), ())

    def forget(self, sink_id: str, guard: ResetGuard) -> None:
        """Each marker group, then the claim, in turn: fence, read stably, check, clear
        (see the module's docstring); then delete the groups, which are empty by then."""
        logged = self._log()
        groups = set(self._groups().get(sink_id, [])) | set(self._by_sink(logged).get(sink_id, []))
        ordered = sorted(g for g in groups if not g.endswith("-claim"))
        ordered += sorted(g for g in groups if g.endswith("-claim"))
        if ordered:
            self._end_open(sink_id)
        for group in ordered:
            self._clear(sink_id, group, logged.get(group), guard)
        job = f"{self.prefix}-{sink_id}{JOB_SUFFIX}"
        if job in self._jobs:
            self._forget_job(job)
        if groups:
            deleted = self.admin.delete_consumer_groups(sorted(groups), request_timeout=TIMEOUT)
            for future in deleted.values():
                with contextlib.suppress(KafkaException):  # gone already, or never had one
                    future.result()

    def _forget_job(self, key: str) -> None:
        """A tombstone for a batch job's record, once its markers are cleared."""
        failed = put_record(self.config, self.marker_log, key.encode(), None)
        if failed:
            raise SinkAdminError(
                f"Removing the job record {key} failed ({failed}): run the reset again."
            )

    def _end_open(self, sink_id: str) -> None:
        """Every open transaction of the sink's task ids aborted before the groups are read
        stably: a batch-commit attempt's id (``...a<slot>``) is not the group's own, so the
        fencing in :meth:`_clear` does not end it, and the offset it holds for the group
        would hold the stable read back. Best effort: a cluster whose coordinators cannot
        be asked (before Kafka 3.0, or without the ACL) leaves them to the fencing and the
        brokers' transaction timeout, and a read that waits too long fails the reset."""
        from eos_connectors.sinks.kafka.coordinator import TransactionClient

        try:
            with contextlib.closing(TransactionClient(self.config, REACH_TIMEOUT)) as client:
                ended = client.sweep(f"{self.prefix}-{sink_id}-", [])
        except Exception as exc:  # best effort: see the docstring
            log.warning("open transactions of sink %s not ended: %s", sink_id, type(exc).__name__)
            return
        if ended:
            log.info("ended %d open transactions of sink %s", len(ended), sink_id)

    def _clear(self, sink_id: str, group: str, logged: Marker | None, guard: ResetGuard) -> None:
        producer = Producer(
            {**self.config, "transactional.id": group, "log_level": 3, "logger": QUIET_LOG}
        )
        consumer = Consumer(
            {
                **self.config,
                "group.id": group,
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "log_level": 3,
                "logger": QUIET_LOG,
            }
        )
        try:
            producer.init_transactions(TIMEOUT)  # fences the old query's producer of the id
            marker = self._stable_marker(consumer, group) or logged
            if marker is not None:
                self._check(sink_id, group, marker, guard)
            producer.begin_transaction()
            topic = marker.topic if marker and marker.topic else self.marker_log
            cleared = [TopicPartition(topic, 0, 0, metadata="")]
            metadata = consumer.consumer_group_metadata()
            producer.send_offsets_to_transaction(cleared, metadata, TIMEOUT)
            producer.produce(self.marker_log, None, group.encode(), partition=0)
            producer.commit_transaction(TIMEOUT)
        except KafkaException as exc:
            raise keeping_code(
                SinkAdminError(
                    f"Resetting {group} of sink {sink_id!r} failed: {exc.args[0].str()}. Run the "
                    "reset again: each group is cleared in a transaction of its own."
                ),
                exc,
            ) from None
        finally:
            consumer.close()

    def _stable_marker(self, consumer: Consumer, group: str) -> Marker | None:
        """The group's marker, read stably (after the fencing, so no transaction of the id
        is open), on the topic the group commits to; None when the group holds none."""
        request = ConsumerGroupTopicPartitions(group)
        listed = self.admin.list_consumer_group_offsets([request])[group].result()
        for position in listed.topic_partitions or []:
            (found,) = consumer.committed([TopicPartition(position.topic, 0)], timeout=TIMEOUT)
            if found.error is None and found.offset >= 0:
                return Marker(found.offset, found.metadata or "", position.topic)
        return None

    def _check(self, sink_id: str, group: str, marker: Marker, guard: ResetGuard) -> None:
        claim = group.endswith("-claim")
        last = None if claim or marker.next_batch == 0 else marker.next_batch - 1
        written = self._written.get(group)
        now = SinkRecord(
            self.store,
            sink_id,
            Lineage(marker.query) if marker.query else None,
            marker.topic,
            last,
            (),
            time.time() - written if written else None,
        )
        refuse(self.store, sink_id, guard.problems(now))
