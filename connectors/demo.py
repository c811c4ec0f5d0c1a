"""The demo behind ``make demo``: real services, a real streaming query, a checked result.

It brings the local stack up (or uses the ``EOS_*`` endpoints), writes keyed
words to a transactional topic with some transactions aborted, and runs a
word count from ``eos_kafka``. The query must count exactly the committed
words: the demo prints expected and counted side by side and fails otherwise.
"""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from collections import Counter

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from connectors.endpoints import Endpoints

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


def _endpoints() -> Endpoints:
    from_env = Endpoints.from_env()
    if from_env is not None:
        return from_env
    from connectors.stack import Stack

    print("Starting the local stack (Kafka, PostgreSQL, Redis)...", flush=True)
    return Stack().up()


def run_demo(records: int = 10_000) -> int:
    endpoints = _endpoints()
    print(endpoints.describe(), end="", flush=True)
    topic = f"eos-demo-{uuid.uuid4().hex[:8]}"
    create_topic(endpoints.kafka_bootstrap, topic, partitions=3)
    expected = produce_words(endpoints.kafka_bootstrap, topic, records)
    print(f"Wrote {records} words to {topic}; {sum(expected.values())} in committed transactions.")

    from pyspark.sql import functions as F

    from connectors.spark import local_session

    spark = local_session("eos-demo")
    counts = (
        spark.readStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max(1000, records // 4)))
        .load()
        .select(F.col("value").cast("string").alias("word"))
        .groupBy("word")
        .count()
    )
    name = f"demo_{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="eos-demo-") as checkpoint:
        query = (
            counts.writeStream.outputMode("complete")
            .format("memory")
            .queryName(name)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
    seconds = time.monotonic() - started
    batches = len(query.recentProgress)
    final = {row["word"]: row["count"] for row in spark.table(name).collect()}
    spark.stop()
    print(f"The streaming query ran {batches} micro-batches in {seconds:.1f} s.")
    return _report(expected, final)


def _report(expected: Counter[str], counted: dict[str, int]) -> int:
    print(f"\n{'word':<10}{'expected':>10}{'counted':>10}")
    for word in sorted(expected):
        print(f"{word:<10}{expected[word]:>10}{counted.get(word, 0)!s:>10}")
    ok = dict(expected) == counted
    total = sum(expected.values())
    verdict = "OK: every committed word counted once" if ok else "MISMATCH"
    print(f"\n{verdict} ({total} words)")
    return 0 if ok else 1
