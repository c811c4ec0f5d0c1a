"""What a sink shows a reader: each key's latest committed count, read whole or watched.

Kafka under ``read_committed``; PostgreSQL and Redis as any client sees them.
Keys are the input record keys as text (``key-00000042``).
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.topics import read_to_end

POLL_RECORDS = 10_000


def _reader(bootstrap: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"eos-bench-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )


def partitions(client: Consumer, topic: str) -> list[TopicPartition]:
    """``topic``'s partitions, asked through a client the caller already has."""
    found = client.list_topics(topic, timeout=30).topics[topic].partitions
    return [TopicPartition(topic, p) for p in sorted(found)]


def kafka_counts(bootstrap: str, topic: str) -> dict[bytes, int]:
    """Each key's last committed count in ``topic``, read up to the end."""
    counts: dict[bytes, int] = {}
    for record in read_to_end(plaintext(bootstrap), topic):  # offset order within each partition
        if record.key is not None:
            counts[record.key] = int(record.value)
    return counts


class Watcher(ABC):
    """Polled by the latency phase: the counts that changed since the last poll.

    A Kafka watcher waits inside its consume call; PostgreSQL and Redis are read
    whole every ``interval`` seconds, which bounds the latency's resolution and
    keeps the watcher's own load off the pipeline's two cores.
    """

    interval = 0.05

    @abstractmethod
    def poll(self) -> dict[str, int]: ...

    def close(self) -> None:  # noqa: B027
        pass


class KafkaWatcher(Watcher):
    interval = 0.0

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = _reader(bootstrap)
        self.consumer.assign(
            [TopicPartition(topic, tp.partition, 0) for tp in partitions(self.consumer, topic)]
        )

    def poll(self) -> dict[str, int]:
        counts = {}
        for message in self.consumer.consume(POLL_RECORDS, 0.02):
            key, value = message.key(), message.value()
            if message.error() is None and key is not None and value is not None:
                counts[key.decode()] = int(value)
        return counts

    def close(self) -> None:
        self.consumer.close()


class PostgresWatcher(Watcher):
    def __init__(self, dsn: str, table: str) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True)
        self.table = table

    def poll(self) -> dict[str, int]:
        from psycopg import errors, sql

        query = sql.SQL("SELECT word, count FROM {}").format(sql.Identifier(self.table))
        try:
            return {word: int(count) for word, count in self.conn.execute(query).fetchall()}
        except errors.UndefinedTable:  # the sink creates it with its first batch
            return {}

    def close(self) -> None:
        self.conn.close()


class RedisWatcher(Watcher):
    def __init__(self, url: str, prefix: str, keys: list[str]) -> None:
        import redis

        self.client: Any = redis.Redis.from_url(url)
        self.prefix = prefix
        self.keys = keys

    def poll(self) -> dict[str, int]:
        values = self.client.mget([self.prefix + key for key in self.keys])
        return {k: int(v) for k, v in zip(self.keys, values, strict=True) if v is not None}

    def close(self) -> None:
        self.client.close()


def postgres_counts(dsn: str, table: str) -> dict[str, int]:
    watcher = PostgresWatcher(dsn, table)
    try:
        return watcher.poll()
    finally:
        watcher.close()


def redis_counts(url: str, prefix: str) -> dict[str, int]:
    import redis

    client: Any = redis.Redis.from_url(url)
    keys = [key.decode() for key in client.scan_iter(f"{prefix}*", count=10_000)]
    values = client.mget(keys) if keys else []
    client.close()
    return {k[len(prefix) :]: int(v) for k, v in zip(keys, values, strict=True) if v is not None}
