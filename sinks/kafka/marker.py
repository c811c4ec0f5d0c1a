"""Task side: a task partition's progress marker, the committed offset of a sink-owned
consumer group (and the same marker in the compacted marker log)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, TopicPartition

from eos_connectors.core.kafka_config import logged
from eos_connectors.sinks.kafka.clients import CALL_LIMIT, CALL_TIMEOUT, call
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.marker_log import Marker, decode, encode, read_for
from eos_connectors.sinks.kafka.options import CONNECT_AT_ONCE, KafkaSinkOptions


class MarkerGroup:
    """The sink-owned consumer group whose committed offset on the marker topic's
    partition 0 is "the next batch to write" for one task partition, with the query
    id that wrote it as the offset's metadata."""

    def __init__(self, options: KafkaSinkOptions, group: str) -> None:
        self.topic = options.marker_topic
        self.group = group
        self.options = options
        #: The marker as the pooled producer's own last transaction left it (set only
        #: while that producer is unfenced; see the module's docstring), else None.
        self.known: tuple[int, str] | None = None
        # committed() asks for the committed offset with require_stable under
        # read_committed: a broker applies a committed transaction's offsets after it
        # answered the commit (Kafka 3.x), and a stable read waits for them instead of
        # returning the marker before them. It also waits while a transaction of the id
        # is open, so it is made only after this task's own init_transactions() ended
        # any such transaction (and before it begins its own).
        self.stable = marker_consumer(options, group, "read_committed")
        # The quick read returns the marker as the group last applied it, never waiting:
        # a pooled producer checks with it whether its marker moved (then it was fenced)
        # and a task whether another query wrote it, before it fences anybody.
        self.quick = marker_consumer(options, group, "read_uncommitted")

    def read(self) -> tuple[int, str]:
        """(batches done, the query id that marked them), read stably: (0, "") before any
        marker. A broker error is raised with its code, never read as "nothing done"."""
        marked = self._committed(self.stable)
        if marked is None:  # never marked, or the group's offsets expired
            return self.read_log()
        return marked

    def read_stable(self) -> tuple[int, str] | None:
        """The marker read stably, None when the group holds none (the log is not read:
        the batch commit keeps its decisions there, not per-partition markers)."""
        return self._committed(self.stable)

    def read_quick(self) -> tuple[int, str] | None:
        """The marker as the group last applied it, without waiting for a transaction that
        is committing or open; None when the group holds none (the log is not read)."""
        return self._committed(self.quick)

    def _committed(self, consumer: Consumer) -> tuple[int, str] | None:
        position = TopicPartition(self.topic, 0)
        marked = call(
            lambda: consumer.committed([position], timeout=CALL_TIMEOUT),
            f"reading marker {self.group}",
        )[0]
        if marked.error is not None:
            raise KafkaSinkError(
                f"Reading the progress marker of {self.group} on {self.topic} failed "
                f"({marked.error.name()}): {marked.error.str()}. Nothing was written; the "
                "task fails so Spark retries it."
            )
        if marked.offset < 0:
            return None
        return int(marked.offset), marked.metadata or ""

    def read_log(self) -> tuple[int, str]:
        """The task partition's last marker in the marker log (read_committed; other tasks'
        transactions write the log too, and one still open must not hide a marker committed
        after it began: :func:`~.marker_log.read_for`): (0, "") when it never wrote
        one."""
        options = self.options
        key = self.group.encode()
        records = read_for(options, lambda found: found == key, f"the marker of {self.group}")
        mine = [r for r in records if r.key == key]
        if not mine or not mine[-1].value:  # none, or a tombstone of `eos sinks reset`
            return 0, ""
        marker = decode(mine[-1].value)
        if marker is None:
            raise KafkaSinkError(
                f"The marker log {options.marker_log!r} holds a record keyed {self.group!r} "
                f"at offset {mine[-1].offset} that is not a sink marker, so whether this "
                "batch was written is unknown. Nothing was written. Remove the record (`eos "
                "sinks reset` writes a tombstone) only if this task partition never wrote "
                "a batch of this query."
            )
        return marker.next_batch, marker.query

    def log_record(
        self, next_batch: int, query_id: str, offsets: str = ""
    ) -> tuple[str, bytes, bytes]:
        """(topic, key, value) of the marker record the transaction writes to the log;
        ``offsets``: the marked batch's source positions' digest, when known."""
        value = encode(Marker(next_batch, query_id, self.topic, offsets))
        return self.options.marker_log, self.group.encode(), value

    def offset(self, next_batch: int, query_id: str) -> TopicPartition:
        return TopicPartition(self.topic, 0, next_batch, metadata=query_id)

    def group_metadata(self) -> Any:
        return self.stable.consumer_group_metadata()

    def join(
        self,
        producer: Any,
        next_batch: int,
        query_id: str,
        what: str,
        limit: float = CALL_LIMIT,
    ) -> None:
        """The marker's offset ``next_batch`` (with ``query_id``) added to ``producer``'s
        open transaction: it becomes the group's committed offset when, and only when,
        that transaction commits. Runs where the producer does (task or driver); each try
        given up after ``limit`` seconds (:func:`~.clients.call`)."""
        offsets = [self.offset(next_batch, query_id)]
        metadata = self.group_metadata()
        call(
            lambda: producer.send_offsets_to_transaction(offsets, metadata, CALL_TIMEOUT),
            what,
            limit,
        )

    def close(self) -> None:
        self.stable.close()
        self.quick.close()


def marker_consumer(options: KafkaSinkOptions, group: str, isolation: str) -> Consumer:
    return Consumer(
        {
            **CONNECT_AT_ONCE,
            **logged(options.client_config()),
            "group.id": group,
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "log_level": 4,
        }
    )


def moved(quick: tuple[int, str] | None, known: tuple[int, str] | None) -> bool:
    """Whether another producer of the id moved the marker past what this one last
    committed (so fenced it), or a reset cleared it. A marker behind the known one, or
    none at all, is this producer's own commit not yet applied by the group: not a move
    (a reset that deleted the group fenced the producer too, which the transaction's
    first call finds out)."""
    if known is None:
        return True
    if quick is None:
        return False
    return quick[1] != known[1] or quick[0] > known[0]
