"""Input for harness runs, tests and benchmarks: transactional words, with event times.

Every fourth transaction is aborted, so a reader that counts aborted records,
or misses committed ones, shows up in the counts.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Iterator

from confluent_kafka import Producer

from eos_connectors.core.kafka_config import logged

WORDS = ("exactly", "once", "spark", "kafka", "postgres", "redis", "batch", "replay")


#: Event times of ``produce_timed_words``, for a topic of one partition read
#: ``batch_offsets`` offsets a batch at most. Record i is stamped EVENT_START + i *
#: EVENT_STEP, except that about one in seven comes up to OUT_OF_ORDER earlier (within
#: the watermark delay: always counted) and, from record ``late_from(batch_offsets)`` on,
#: one in thirty is late by ``late_ms(batch_offsets)`` and one in thirty by at least an
#: hour. A late record's window closed more than two batches of records before it, so
#: it is dropped however the source cuts the batches (Spark drops a row of batch N whose
#: window ended at the watermark of batch N-1, which comes from the records of batches
#: up to N-2). After them comes a tail of more than a batch of records an hour ahead:
#: whatever the last batch holds, an earlier one carries the tail's event time, so the
#: watermark passes every window of the words before it and Spark emits them all (an
#: availableNow query runs no batch without data at its end). The tail's own window is
#: never emitted. So what the query must write follows from the input alone
#: (``cells.window_counts``). Fixed times, so a run is reproducible; the topic must keep
#: old records (retention.ms=-1).
EVENT_START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
EVENT_STEP_MS = 50
OUT_OF_ORDER_MS = 4_000
VERY_LATE_MS = 3_600_000
TAIL_AHEAD_MS = 3_600_000
#: Records per input transaction (every fourth aborted).
PER_TXN = 500


def late_from(batch_offsets: int) -> int:
    """The first record that may be late: two batches and two transactions in, so that a
    committed record in order lies two batches of offsets before it."""
    return 2 * batch_offsets + 2 * PER_TXN


def late_ms(batch_offsets: int) -> int:
    """How far a late record is stamped behind its place: its window (10 s), the watermark
    delay (5 s) and the out-of-order margin closed before the records of
    ``late_from(batch_offsets)`` offsets earlier."""
    return late_from(batch_offsets) * EVENT_STEP_MS + 20_000


#: One input transaction: its (word, timestamp) pairs, and whether it commits.
Transaction = tuple[list[tuple[str, int]], bool]


def produce_words(
    bootstrap: str,
    topic: str,
    records: int,
    seed: int = 7,
    vocabulary: tuple[str, ...] = WORDS,
) -> Counter[str]:
    """Write ``records`` words in transactions, aborting every fourth but the last; return
    committed counts."""
    return _produce(bootstrap, topic, transactions(records, seed, vocabulary))


def produce_timed_words(
    bootstrap: str,
    topic: str,
    records: int,
    batch_offsets: int,
    seed: int = 7,
    vocabulary: tuple[str, ...] = WORDS,
) -> None:
    """Like ``produce_words``, with explicit record timestamps that move forward in event
    time, some out of order and some late, then the tail (see EVENT_*); the event-time
    cell's input, for a query that reads at most ``batch_offsets`` offsets a batch."""
    _produce(bootstrap, topic, transactions(records, seed, vocabulary, batch_offsets))


def transactions(
    records: int,
    seed: int = 7,
    vocabulary: tuple[str, ...] = WORDS,
    timed: int | None = None,
) -> Iterator[Transaction]:
    """The input's transactions, every fourth aborted but the last: the input ends with
    committed records, so the batches a plan counts over ``records`` offsets all read
    some (2,000 records end with their fourth transaction, and a query planned six
    batches of 333 offsets found nothing after its fifth). ``timed``: the batch size in
    offsets, for event times and the tail (see EVENT_*); None: timestamp 0, the
    producer's clock."""
    rng = random.Random(seed)
    last = (records - 1) // PER_TXN
    for txn, first in enumerate(range(0, records, PER_TXN)):
        words = [rng.choice(vocabulary) for _ in range(min(PER_TXN, records - first))]
        stamps = [
            0 if timed is None else event_time(index, rng, timed)
            for index in range(first, first + len(words))
        ]
        yield list(zip(words, stamps, strict=True)), txn % 4 != 3 or txn == last
    if timed is None:
        return
    ahead = EVENT_START_MS + records * EVENT_STEP_MS + TAIL_AHEAD_MS
    tail = [vocabulary[i % len(vocabulary)] for i in range(timed + PER_TXN)]
    for first in range(0, len(tail), PER_TXN):
        yield [(word, ahead) for word in tail[first : first + PER_TXN]], True


def event_time(index: int, rng: random.Random, batch_offsets: int) -> int:
    stamp = EVENT_START_MS + index * EVENT_STEP_MS
    draw = rng.random()
    if index >= late_from(batch_offsets) and draw < 0.066:
        behind = VERY_LATE_MS if draw < 0.033 else late_ms(batch_offsets)
        return stamp - max(behind, late_ms(batch_offsets))
    if draw < 0.2:
        return stamp - rng.randrange(OUT_OF_ORDER_MS)
    return stamp


#: Of the changes to a key that exists, how many delete it (the rest update it).
DELETE_SHARE = 0.25


def produce_changes(
    bootstrap: str, topic: str, records: int, seed: int = 7, keys: tuple[str, ...] = WORDS
) -> None:
    """A change stream of ``keys``: record key = the key, value ``<op>:<version>`` with op
    ``c`` (insert: the key does not exist), ``u`` (update) or ``d`` (delete, about one in
    four changes of an existing key), ``version`` counting the key's changes (aborted ones
    too). In transactions, every fourth aborted, like the other inputs; the final state
    follows from the committed records alone (:func:`final_state`)."""
    rng = random.Random(seed)
    versions: Counter[str] = Counter()
    live: set[str] = set()
    producer = Producer(
        logged({"bootstrap.servers": bootstrap, "transactional.id": f"demo-{topic}"})
    )
    producer.init_transactions(30)
    for txn, first in enumerate(range(0, records, PER_TXN)):
        producer.begin_transaction()
        for _ in range(min(PER_TXN, records - first)):
            key = rng.choice(keys)
            versions[key] += 1
            deleted = key in live and rng.random() < DELETE_SHARE
            op = "d" if deleted else "u" if key in live else "c"
            (live.discard if op == "d" else live.add)(key)
            producer.produce(topic, key=key.encode(), value=f"{op}:{versions[key]}".encode())
        if txn % 4 != 3:
            producer.commit_transaction(30)
        else:
            producer.flush(30)
            producer.abort_transaction(30)


def final_state(records: Iterable[tuple[bytes | None, bytes]]) -> dict[str, int]:
    """What a table kept in step with a change stream holds at its end: each key's version
    after its last change, in the order given (a key's changes are in one partition,
    in offset order), and no key whose last change deletes it."""
    state: dict[str, int] = {}
    for key, value in records:
        name = (key or b"").decode()
        op, _, version = value.decode().partition(":")
        if op == "d":
            state.pop(name, None)
        else:
            state[name] = int(version)
    return state


def _produce(bootstrap: str, topic: str, input_: Iterable[Transaction]) -> Counter[str]:
    """Write the transactions; return the committed words' counts."""
    producer = Producer(
        logged({"bootstrap.servers": bootstrap, "transactional.id": f"demo-{topic}"})
    )
    producer.init_transactions(30)
    expected: Counter[str] = Counter()
    for pairs, commits in input_:
        producer.begin_transaction()
        for word, stamp in pairs:
            producer.produce(topic, key=word.encode(), value=word.encode(), timestamp=stamp)
        if commits:
            producer.commit_transaction(30)
            expected.update(word for word, _stamp in pairs)
        else:
            producer.flush(30)
            producer.abort_transaction(30)
    return expected
