"""Read each sink's content back and compare it with the expected counts.

Every check returns a :class:`SinkResult`: records expected, lost and
duplicated (summed over words), wrong (words the input never had, values that
are not counts), and leftovers (prepared transactions, open Kafka transactions,
Redis stages) that a clean run must not leave.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Producer, TopicPartition

Reader = Callable[[], Mapping[str, int]]


@dataclass(frozen=True)
class SinkResult:
    sink: str
    expected: int
    lost: int
    duplicated: int
    wrong: int
    leftovers: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.wrong or self.leftovers)


def compare(
    sink: str,
    expected: Counter[str],
    got: Mapping[str, int],
    repeated: int = 0,
    leftovers: tuple[str, ...] = (),
) -> SinkResult:
    """Per word: fewer than expected is lost, more is duplicated; an unknown word is wrong."""
    lost = sum(max(0, n - got.get(word, 0)) for word, n in expected.items())
    extra = sum(max(0, got[word] - n) for word, n in expected.items() if word in got)
    wrong = sum(1 for word in got if word not in expected)
    return SinkResult(sink, sum(expected.values()), lost, extra + repeated, wrong, leftovers)


def postgres_counts(
    dsn: str, table: str, sink_id: str = ""
) -> tuple[dict[str, int], tuple[str, ...]]:
    """The table's counts, and the sink's prepared transactions (every sink's when
    ``sink_id`` is empty)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT word, count FROM {}").format(sql.Identifier(table))
        ).fetchall()
        prepared = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
            (f"eos|{sink_id}|" if sink_id else "eos|",),
        ).fetchall()
    leftovers = tuple(f"prepared transaction {gid}" for (gid,) in prepared)
    return {str(w): int(c) for w, c in rows}, leftovers


def redis_counts(
    url: str, prefix: str, sink_id: str = "*"
) -> tuple[dict[str, int], tuple[str, ...]]:
    """Counters under ``prefix``, and the sink's stages and registered units."""
    import redis

    client = redis.Redis.from_url(url)
    counts = {
        key.decode().removeprefix(prefix): int(client.get(key) or 0)
        for key in client.scan_iter(f"{prefix}*", count=1000)
    }
    stages = [k.decode() for k in client.scan_iter(f"eos:{{{sink_id}}}:stage:*", count=1000)]
    units = [k.decode() for k in client.scan_iter(f"eos:{{{sink_id}}}:units") if client.scard(k)]
    client.close()
    return counts, tuple(f"Redis stage {k}" for k in stages + units)


MARKER = b"\0eos-verify-marker"


def kafka_counts(
    bootstrap: str, topic: str, timeout: float = 60.0
) -> tuple[dict[str, int], int, tuple[str, ...]]:
    """Final count per word, how many (word, count) records were written more than once,
    and leftovers: a marker written now to every partition must become readable under
    read_committed, which an open transaction before it would prevent."""
    markers = _write_markers(bootstrap, topic)
    records, unreached = _read_committed(bootstrap, topic, markers, timeout)
    pairs = [(key, value) for key, value in records if key != MARKER]
    words: dict[str, int] = {}
    for key, value in pairs:
        words[key.decode()] = max(words.get(key.decode(), 0), int(value))
    leftovers = tuple(
        f"open transaction on {topic}[{p}]: a marker is not readable under read_committed"
        for p in sorted(unreached)
    )
    return words, len(pairs) - len(set(pairs)), leftovers


def _write_markers(bootstrap: str, topic: str) -> dict[int, int]:
    """One plain record per partition; returns each marker's offset."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    partitions = producer.list_topics(topic, timeout=30).topics[topic].partitions
    offsets: dict[int, int] = {}

    def delivered(err: object, message: object) -> None:
        assert err is None, f"marker not delivered: {err}"
        offsets[message.partition()] = message.offset()  # type: ignore[attr-defined]

    for partition in partitions:
        producer.produce(topic, MARKER, MARKER, partition=partition, on_delivery=delivered)
    producer.flush(30)
    return offsets


def _read_committed(
    bootstrap: str, topic: str, markers: dict[int, int], timeout: float
) -> tuple[list[tuple[bytes, bytes]], set[int]]:
    """Records up to and including each partition's marker, and the partitions whose
    marker stayed out of reach for ``timeout`` seconds."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"eos-verify-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in markers])
    records: list[tuple[bytes, bytes]] = []
    left = set(markers)
    deadline = time.monotonic() + timeout
    while left and time.monotonic() < deadline:
        for message in consumer.consume(10_000, 0.5):
            if message.error() is None:
                records.append((message.key() or b"", message.value() or b""))
                if message.offset() == markers[message.partition() or 0]:
                    left.discard(message.partition() or 0)
    consumer.close()
    return records, left
