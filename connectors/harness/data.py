"""Input for harness runs, tests and benchmarks: topics and transactional words.

Every fourth transaction is aborted, so a reader that counts aborted records,
or misses committed ones, shows up in the counts.
"""

from __future__ import annotations

import random
from collections import Counter

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

WORDS = ("exactly", "once", "spark", "kafka", "postgres", "redis", "batch", "replay")


def produce_words(
    bootstrap: str,
    topic: str,
    records: int,
    seed: int = 7,
    vocabulary: tuple[str, ...] = WORDS,
) -> Counter[str]:
    """Write ``records`` words in transactions, aborting every fourth; return committed counts."""
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"demo-{topic}"})
    producer.init_transactions(30)
    expected: Counter[str] = Counter()
    per_txn = 500
    for txn, first in enumerate(range(0, records, per_txn)):
        words = [rng.choice(vocabulary) for _ in range(min(per_txn, records - first))]
        producer.begin_transaction()
        for word in words:
            producer.produce(topic, key=word.encode(), value=word.encode())
        if txn % 4 == 3:
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            expected.update(words)
    return expected


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout=30)
