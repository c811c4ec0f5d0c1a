"""A reference: a hand-written confluent-kafka transactional consume -> count -> produce
loop, in one process on one core (the report gives its figures per core).

``python -m eos_connectors.dev.compare.raw_loop BOOTSTRAP INPUT OUTPUT TRANSACTIONAL_ID``.
Each poll of up to 10,000 records is one transaction: the changed keys' new
counts and the consumer's positions commit together. The partitions are
assigned, not subscribed (no group rebalance after a crash); a restart fences the
dead producer by its transactional id, then rebuilds the counts from the output
topic (read_committed) and resumes from the committed offsets: exactly-once, the
way Kafka Streams restores a changelog.
"""

from __future__ import annotations

import sys
import time
from collections import Counter

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from eos_connectors.dev.compare.readers import kafka_counts, partitions
from eos_connectors.dev.harness.pipeline import print_event

POLL_RECORDS = 10_000


def run(bootstrap: str, source: str, output: str, transactional_id: str) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5}
    )
    producer.init_transactions()  # fences a previous incarnation's open transaction
    counts = kafka_counts(bootstrap, output)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": transactional_id,
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    committed = consumer.committed(partitions(consumer, source), timeout=30)
    consumer.assign(
        [
            TopicPartition(source, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_BEGINNING)
            for tp in committed
        ]
    )
    print_event("ready")
    while True:
        messages = [m for m in consumer.consume(POLL_RECORDS, 0.2) if m.error() is None]
        if not messages:
            continue
        producer.begin_transaction()
        changed = Counter(m.key() or b"" for m in messages)
        for key, added in changed.items():
            total = counts[key] = counts.get(key, 0) + added
            producer.produce(output, key=key, value=b"%d" % total)
        began = time.perf_counter()
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata()
        )
        producer.commit_transaction()
        print_event(
            "batch",
            records=len(messages),
            outputs=len(changed),
            commit_ms=(time.perf_counter() - began) * 1000,
        )


if __name__ == "__main__":
    run(*sys.argv[1:5])
