"""Helpers for tests on the real broker: mixed transactional input, plain records, partitions.

Topics are created and read back with :mod:`connectors.topics`."""

from __future__ import annotations

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions


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
