"""Input for harness runs, tests and benchmarks: transactional words, with event times.

Every fourth transaction is aborted, so a reader that counts aborted records,
or misses committed ones, shows up in the counts.
"""

from __future__ import annotations

import random
from collections import Counter

from confluent_kafka import Producer

WORDS = ("exactly", "once", "spark", "kafka", "postgres", "redis", "batch", "replay")


#: Event times of ``produce_timed_words``: record i is stamped EVENT_START + i * EVENT_STEP,
#: except that about one in seven comes up to OUT_OF_ORDER earlier (within the watermark
#: delay: always counted), one in thirty LATE earlier (dropped or not depending on where
#: the batch boundaries fall, which Spark's offsets log fixes for every replay) and one in
#: thirty VERY_LATE earlier (behind the watermark from the third batch on, whatever the
#: batch size). Fixed times, so a run is reproducible; the topic must keep old records
#: (retention.ms=-1).
EVENT_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
EVENT_STEP_MS = 50
OUT_OF_ORDER_MS = 4_000
LATE_MS = 45_000
VERY_LATE_MS = 3_600_000


def produce_words(
    bootstrap: str,
    topic: str,
    records: int,
    seed: int = 7,
    vocabulary: tuple[str, ...] = WORDS,
) -> Counter[str]:
    """Write ``records`` words in transactions, aborting every fourth; return committed counts."""
    return _produce(bootstrap, topic, records, seed, vocabulary, timed=False)


def produce_timed_words(
    bootstrap: str,
    topic: str,
    records: int,
    seed: int = 7,
    vocabulary: tuple[str, ...] = WORDS,
) -> Counter[str]:
    """Like ``produce_words``, with explicit record timestamps that move forward in event time,
    some out of order and some late (see EVENT_*); the event-time cell's input."""
    return _produce(bootstrap, topic, records, seed, vocabulary, timed=True)


def event_time(index: int, rng: random.Random) -> int:
    stamp = EVENT_START_MS + index * EVENT_STEP_MS
    draw = rng.random()
    if draw < 0.033:
        return stamp - VERY_LATE_MS
    if draw < 0.066:
        return stamp - LATE_MS
    if draw < 0.2:
        return stamp - rng.randrange(OUT_OF_ORDER_MS)
    return stamp


def _produce(
    bootstrap: str,
    topic: str,
    records: int,
    seed: int,
    vocabulary: tuple[str, ...],
    timed: bool,
) -> Counter[str]:
    rng = random.Random(seed)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"demo-{topic}"})
    producer.init_transactions(30)
    expected: Counter[str] = Counter()
    per_txn = 500
    for txn, first in enumerate(range(0, records, per_txn)):
        words = [rng.choice(vocabulary) for _ in range(min(per_txn, records - first))]
        producer.begin_transaction()
        for index, word in enumerate(words, start=first):
            stamp = event_time(index, rng) if timed else 0  # 0: the producer's clock
            producer.produce(topic, key=word.encode(), value=word.encode(), timestamp=stamp)
        if txn % 4 == 3:
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
            expected.update(words)
    return expected
