"""Read each sink's content back and compare it with the expected counts.

Every check returns a :class:`SinkResult`: records expected, lost and
duplicated (summed over words), wrong (words the input never had, values that
are not counts), and leftovers (prepared transactions, open Kafka transactions,
Redis stages) that a clean run must not leave.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from eos_connectors.core.kafka_config import logged, plaintext
from eos_connectors.core.topics import read_to_end


@dataclass(frozen=True)
class Observed:
    """What a sink holds: count per word, records written twice, leftovers of the protocol."""

    counts: Mapping[str, int]
    repeated: int = 0
    leftovers: tuple[str, ...] = ()


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


def compare(sink: str, expected: Mapping[str, int], got: Observed) -> SinkResult:
    """Per word: fewer than expected is lost, more is duplicated; an unknown word is wrong."""
    counts = got.counts
    lost = sum(max(0, n - counts.get(word, 0)) for word, n in expected.items())
    extra = sum(max(0, counts[word] - n) for word, n in expected.items() if word in counts)
    wrong = sum(1 for word in counts if word not in expected)
    return SinkResult(
        sink, sum(expected.values()), lost, extra + got.repeated, wrong, got.leftovers
    )


def postgres_counts(dsn: str, table: str, sink_id: str = "") -> Observed:
    """The table's (word, count) rows, and the sink's prepared transactions (every sink's
    when ``sink_id`` is empty)."""
    rows = _postgres_rows(dsn, "SELECT word, count FROM {}", table)
    return Observed({str(w): int(str(c)) for w, c in rows}, 0, _prepared(dsn, sink_id))


def postgres_rows(dsn: str, table: str, sink_id: str = "") -> Observed:
    """An append table of (word, partition, offset) rows: count per word, and rows of one
    input record written more than once."""
    rows = _postgres_rows(dsn, 'SELECT word, partition, "offset" FROM {}', table)
    counts = Counter(str(word) for word, _p, _o in rows)
    repeated = len(rows) - len({(p, o) for _w, p, o in rows})
    return Observed(counts, repeated, _prepared(dsn, sink_id))


def _postgres_rows(dsn: str, query: str, table: str) -> list[tuple[object, ...]]:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(sql.SQL(query).format(sql.Identifier(table))).fetchall()


def _prepared(dsn: str, sink_id: str) -> tuple[str, ...]:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        prepared = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)",
            (f"eos|{sink_id}|" if sink_id else "eos|",),
        ).fetchall()
    return tuple(f"prepared transaction {gid}" for (gid,) in prepared)


def redis_counts(url: str, prefix: str, sink_id: str = "*") -> Observed:
    """Counters (or values) under ``prefix``, and the sink's stages and registered units."""
    import redis

    client = redis.Redis.from_url(url)
    counts = {
        key.decode().removeprefix(prefix): int(client.get(key) or 0)
        for key in client.scan_iter(f"{prefix}*", count=1000)
    }
    stages = [k.decode() for k in client.scan_iter(f"eos:{{{sink_id}}}:stage:*", count=1000)]
    units = [k.decode() for k in client.scan_iter(f"eos:{{{sink_id}}}:units") if client.scard(k)]
    client.close()
    return Observed(counts, 0, tuple(f"Redis stage {k}" for k in stages + units))


def kafka_counts(bootstrap: str, topic: str, timeout: float = 30.0) -> Observed:
    """Final count per word: the *last* (word, count) record of each word, in offset order
    (a running count's records of one word go to one partition), so a count that went
    5 then 3 shows as 3; how many (word, count) records were written more than once;
    and leftovers: partitions whose last stable offset stays below their end for
    ``timeout`` (:func:`open_transactions`), which only an open transaction causes."""
    stuck = open_transactions(bootstrap, topic, timeout)
    records = read_to_end(plaintext(bootstrap), topic)
    pairs = [(r.key or b"", r.value) for r in records]
    words: dict[str, int] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        words[(record.key or b"").decode()] = int(record.value)
    leftovers = tuple(
        f"open transaction on {topic}[{p}]: its end is not readable under read_committed"
        for p in sorted(stuck)
    )
    return Observed(words, len(pairs) - len(set(pairs)), leftovers)


def kafka_final_state(bootstrap: str, topic: str, timeout: float = 30.0) -> Observed:
    """A change stream's output topic read to its final state, as compaction would leave
    it: each key's last value in offset order, a tombstone (null value) removing the key;
    (key, value) records written more than once (tombstones aside); open transactions."""
    stuck = open_transactions(bootstrap, topic, timeout)
    records = read_to_end(plaintext(bootstrap), topic)
    state: dict[str, int] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        key = (record.key or b"").decode()
        if not record.value:  # a tombstone (read_to_end gives a null value as b"")
            state.pop(key, None)
        else:
            state[key] = int(record.value)
    pairs = [(r.key, r.value) for r in records if r.value]
    leftovers = tuple(f"open transaction on {topic}[{p}]" for p in sorted(stuck))
    return Observed(state, len(pairs) - len(set(pairs)), leftovers)


def kafka_records(bootstrap: str, topic: str, timeout: float = 30.0) -> Observed:
    """Records per word (key), each input record's (key, "partition:offset") written more
    than once, and open transactions as leftovers."""
    stuck = open_transactions(bootstrap, topic, timeout)
    pairs = [(r.key or b"", r.value) for r in read_to_end(plaintext(bootstrap), topic)]
    counts = Counter(key.decode() for key, _ in pairs)
    leftovers = tuple(f"open transaction on {topic}[{p}]" for p in sorted(stuck))
    return Observed(counts, len(pairs) - len(set(pairs)), leftovers)


def open_transactions(bootstrap: str, topic: str, timeout: float = 30.0) -> set[int]:
    """Partitions of ``topic`` where a transaction is left open
    (:func:`open_transactions_in`)."""
    return {p for t, p in open_transactions_in(bootstrap, [topic], timeout)}


def open_transactions_in(
    bootstrap: str, topics: list[str], timeout: float = 30.0
) -> set[tuple[str, int]]:
    """(topic, partition) of ``topics`` where a transaction is left open: the partition's
    last stable offset (its read_committed end) stays below the log's end as it is now
    until ``timeout`` ends, which only an open transaction's first record holds it to.
    Nothing is written (a probe record once written here landed in the shared marker log,
    where ``eos sinks`` warned about it)."""
    if not topics:
        return set()
    admin = AdminClient(logged({"bootstrap.servers": bootstrap}))
    metadata = admin.list_topics(timeout=30).topics
    partitions = [TopicPartition(t, p) for t in topics for p in metadata[t].partitions]
    ends = _latest(admin, partitions, IsolationLevel.READ_UNCOMMITTED)
    deadline = time.monotonic() + timeout
    while True:
        stable = _latest(admin, partitions, IsolationLevel.READ_COMMITTED)
        stuck = {tp for tp, end in ends.items() if stable.get(tp, 0) < end}
        if not stuck or time.monotonic() > deadline:
            return stuck
        time.sleep(0.5)


def _latest(
    admin: AdminClient, partitions: list[TopicPartition], isolation: IsolationLevel
) -> dict[tuple[str, int], int]:
    """Each partition's end offset as a reader of ``isolation`` sees it."""
    request = {tp: OffsetSpec.latest() for tp in partitions}
    futures = admin.list_offsets(request, isolation_level=isolation, request_timeout=30)
    return {(tp.topic, tp.partition): f.result(timeout=30).offset for tp, f in futures.items()}
