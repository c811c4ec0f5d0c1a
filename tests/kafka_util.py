"""Helpers for tests on the real broker: topics, mixed transactional input, plain reads."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions, NewTopic


@dataclass(frozen=True, order=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes


def create_topic(bootstrap: str, topic: str, partitions: int = 1, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(timeout=30)


def add_partitions(bootstrap: str, topic: str, total: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, total)])[topic].result(timeout=30)


def produce_mixed(
    bootstrap: str, topic: str, partitions: int, transactions: int, per_txn: int, txn_id: str
) -> set[bytes]:
    """Committed and aborted transactions interleaved with plain records; return visible values."""
    visible: set[bytes] = set()
    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5})
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    txn.init_transactions(30)
    for n in range(transactions):
        values = [f"t{n}-r{i}".encode() for i in range(per_txn)]
        txn.begin_transaction()
        for i, value in enumerate(values):
            txn.produce(topic, value=value, key=f"k{i}".encode(), partition=i % partitions)
        if n % 3 == 1:
            txn.flush(30)
            txn.abort_transaction(30)
        else:
            txn.commit_transaction(30)
            visible.update(values)
        plain_value = f"plain-{n}".encode()
        plain.produce(topic, value=plain_value, key=b"p", partition=n % partitions)
        plain.flush(30)
        visible.add(plain_value)
    return visible


def produce_plain(
    bootstrap: str, topic: str, values: list[bytes], partition: int | None = None
) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for value in values:
        if partition is None:
            producer.produce(topic, value=value, key=value)
        else:
            producer.produce(topic, value=value, key=value, partition=partition)
    producer.flush(30)


def read_plain(
    bootstrap: str, topic: str, ranges: dict[int, tuple[int, int]], timeout: float = 60
) -> list[Record]:
    """What a plain read_committed confluent-kafka consumer returns for the given ranges."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "test-plain-reader",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    wanted = {p: r for p, r in ranges.items() if r[1] > r[0]}
    consumer.assign([TopicPartition(topic, p, lo) for p, (lo, _hi) in wanted.items()])
    records: list[Record] = []
    deadline = time.monotonic() + timeout
    try:
        while wanted and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                if message.error() is not None:
                    continue
                record = Record(
                    int(message.partition() or 0),
                    int(message.offset() or 0),
                    message.key(),
                    message.value() or b"",
                )
                if record.offset < wanted[record.partition][1]:
                    records.append(record)
            positions = consumer.position([TopicPartition(topic, p) for p in wanted])
            for tp in positions:
                if tp.offset >= wanted[tp.partition][1]:
                    del wanted[tp.partition]
                    consumer.incremental_unassign([TopicPartition(topic, tp.partition)])
    finally:
        consumer.close()
    assert not wanted, f"plain reader did not reach the end of {wanted}"
    return records
