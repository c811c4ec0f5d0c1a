"""Helpers for tests on the real broker: mixed transactional input, plain records, partitions.

Topics are created and read back with :mod:`eos_connectors.core.topics`."""

from __future__ import annotations

import time

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewPartitions

from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.topics import create_topic
from eos_connectors.ops.locations import Location


def add_partitions(bootstrap: str, topic: str, total: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_partitions([NewPartitions(topic, total)])[topic].result(timeout=30)


def recreate_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    """Delete ``topic`` and create it again under the same name (it gets a new topic id)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.delete_topics([topic])[topic].result(timeout=30)
    deadline = time.monotonic() + 60
    while True:  # the name is free once the brokers have finished deleting
        try:
            create_topic(plaintext(bootstrap), topic, partitions)
            return
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def uncommit(checkpoint: Location, batch: int) -> None:
    """Remove ``commits/<batch>`` (and its checksum) as a crash before Spark wrote it would."""
    for name in (str(batch), f".{batch}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)


def delete_records_before(bootstrap: str, topic: str, partition: int, before: int) -> None:
    """Move the partition's log start to ``before``, as retention would."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition(topic, partition, before)])
    for future in futures.values():
        future.result(timeout=30)


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
