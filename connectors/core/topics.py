"""Kafka topics for the harness, benchmarks and tests: create one, read one to its end.

``read_to_end`` is the one reader every check uses: it reads each partition from
its start (or a given range) until the consumer's *position* reaches the end
offset asked for at call time: the last stable offset under read_committed, so a
transaction left open shows up as records never reached, never as a hang. With
``settled=True`` it reads up to the high watermark instead, under read_committed:
it waits until every transaction open at call time has ended, so a record
committed before the call is never missed because another transaction, still
open, holds the last stable offset below it (the sink's marker log, which every
task's transaction writes to, needs this).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]
from confluent_kafka.cimpl import NewTopic

from eos_connectors.core.errors import ServiceUnavailableError
from eos_connectors.core.kafka_config import KafkaConfig, bootstrap, connection, logged
from eos_connectors.core.kafka_errors import error_code, leader_moving

TIMEOUT = 30.0


@dataclass(frozen=True, order=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp: int = field(default=0, compare=False)  # milliseconds, as the broker has it


def create_topic(kafka: KafkaConfig, topic: str, partitions: int = 1, **config: str) -> None:
    """Create ``topic`` on the cluster ``kafka`` reaches and wait until the brokers'
    metadata lists each partition with a leader: the creation's answer comes when the
    controller has it, a moment before the brokers serve it (a broker with thousands of
    topics listed a topic just created on one listener as missing on its other one)."""
    admin = AdminClient(logged(connection(kafka)))
    # replication -1: the brokers' default.replication.factor (3 on the replicated stack)
    admin.create_topics([NewTopic(topic, partitions, -1, config=config)])[topic].result(TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while not _served(admin, topic, partitions):
        if time.monotonic() > deadline:
            raise ServiceUnavailableError(
                f"Kafka at {bootstrap(kafka)} created topic {topic!r} but does not list its "
                f"{partitions} partition(s) with leaders after {TIMEOUT:.0f} s."
            )
        time.sleep(0.05)


def _served(admin: AdminClient, topic: str, partitions: int) -> bool:
    meta = admin.list_topics(topic, timeout=TIMEOUT).topics.get(topic)
    if meta is None or meta.error is not None or len(meta.partitions) != partitions:
        return False
    return all(p.leader >= 0 for p in meta.partitions.values())


def end_offsets(
    kafka: KafkaConfig, topic: str, isolation: str = "read_committed"
) -> dict[int, int]:
    """Partition -> end offset now: the last stable offset under read_committed, else the
    high watermark. A leader that is moving or does not answer (a broker of a replicated
    cluster killed, frozen or restarting) is asked again with a new client, whose metadata
    is fresh, for up to ``TIMEOUT``: each ask gets ``ASK_TIMEOUT``, because librdkafka
    keeps waiting on the leader its metadata named when the ask began, dead or not (a
    task's read of the sink's marker log once waited the whole 30 s on a killed broker,
    then failed with a bare ``TimeoutError``). A partition answered with no offset (-1001,
    its leader just died) is asked again too: read as an end, it would hide records."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            ends = _end_offsets(kafka, topic, isolation)
        except (KafkaException, TimeoutError) as exc:
            if not _ask_again(exc):
                raise
            why = _why(exc)
        else:
            unknown = sorted(p for p, end in ends.items() if end < 0)
            if not unknown:
                return ends
            why = f"no end offset for partitions {unknown}"  # -1001: the leader just died
        if time.monotonic() > deadline:
            raise ServiceUnavailableError(
                f"Kafka at {bootstrap(kafka)} gave no end offsets of topic {topic!r} within "
                f"{TIMEOUT:.0f} s (asked again with a new client every {ASK_TIMEOUT:.0f} s at "
                f"most): {why}. Check that the leaders of its partitions are up and reachable."
            )
        time.sleep(0.5)


#: Seconds one ask for a topic's end offsets may take before it is made again.
ASK_TIMEOUT = 10.0


def _ask_again(exc: BaseException) -> bool:
    """Whether an ask for end offsets failed in a way that a new ask may not: no answer in
    time, or a leader moving."""
    code = error_code(exc)
    return isinstance(exc, TimeoutError) or code == KafkaError._TIMED_OUT or leader_moving(exc)


def _why(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args:
        return str(exc.args[0].str())
    return "no answer in time"


def _end_offsets(kafka: KafkaConfig, topic: str, isolation: str) -> dict[int, int]:
    admin = AdminClient(logged(connection(kafka)))
    metadata = admin.list_topics(topic, timeout=ASK_TIMEOUT).topics[topic]
    level = (
        IsolationLevel.READ_COMMITTED
        if isolation == "read_committed"
        else IsolationLevel.READ_UNCOMMITTED
    )
    request = {TopicPartition(topic, p): OffsetSpec.latest() for p in metadata.partitions}
    futures = admin.list_offsets(request, isolation_level=level, request_timeout=ASK_TIMEOUT)
    return {tp.partition: int(f.result(timeout=ASK_TIMEOUT).offset) for tp, f in futures.items()}


READ_POLL_SECONDS = 0.05


def read_to_end(
    kafka: KafkaConfig,
    topic: str,
    isolation: str = "read_committed",
    ranges: Mapping[int, tuple[int, int]] | None = None,
    timeout: float = 120.0,
    settled: bool = False,
) -> list[Record]:
    """Every record of ``topic`` (or of ``ranges``: partition -> [start, end)) as a plain
    confluent-kafka consumer under ``isolation`` returns it, in partition and offset order;
    ``settled``: to the high watermark, every transaction open now ended (see above)."""
    if ranges is None:
        ends = end_offsets(kafka, topic, "read_uncommitted" if settled else isolation)
        ranges = {p: (0, end) for p, end in ends.items()}
    wanted = {p: r for p, r in ranges.items() if r[1] > r[0]}
    consumer = Consumer(
        {
            **logged(connection(kafka)),
            "group.id": f"eos-read-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "log_level": 3,
        }
    )
    consumer.assign([TopicPartition(topic, p, lo) for p, (lo, _hi) in wanted.items()])
    records: list[Record] = []
    at = {p: lo for p, (lo, _hi) in wanted.items()}
    deadline = time.monotonic() + timeout
    try:
        while wanted:
            if time.monotonic() > deadline:
                raise ServiceUnavailableError(
                    f"Reading {topic} under {isolation} did not reach the end of partitions "
                    f"{sorted(wanted)} within {timeout:.0f} s."
                )
            # consume() returns once it holds this many or the timeout ends: asking for
            # no more than is left returns when the last record is in (a fixed 10,000
            # and 0.5 s cost every short read half a second; a task's marker-log read
            # too). Transaction markers make it an overestimate: the short timeout.
            left = sum(wanted[p][1] - at[p] for p in wanted)
            for message in consumer.consume(max(1, min(10_000, left)), READ_POLL_SECONDS):
                partition, offset = int(message.partition() or 0), int(message.offset() or 0)
                if message.error() is None and offset < wanted.get(partition, (0, 0))[1]:
                    stamp = int(message.timestamp()[1])
                    records.append(
                        Record(partition, offset, message.key(), message.value() or b"", stamp)
                    )
            for tp in consumer.position([TopicPartition(topic, p) for p in wanted]):
                at[tp.partition] = max(at[tp.partition], tp.offset)
                if tp.offset >= wanted[tp.partition][1]:
                    del wanted[tp.partition]
    except KafkaException as exc:
        raise ServiceUnavailableError(f"Reading {topic} failed: {exc}") from exc
    finally:
        consumer.close()
    return sorted(records)
