"""The Kafka sink's batch decisions (``commitMode=batch``): where a decided batch and its
transactions are kept, since Kafka has no table.

* The **pointer**: the committed offset ``batch + 1`` of the group
  ``<prefix>-<sink id>-decision`` on the marker topic's partition 0, the query id as its
  metadata: tasks read it before they touch their transactional id.
* The **record**: the decided batch's transactions (id, producer id, epoch per task
  partition) as one JSON value keyed by the group's name in the compacted marker log.

Both are written in one transaction of the sink's *decider*, the transactional id of the
same name, by its newest claimer: a stream's driver process (:mod:`.stream_decider`) or a
batch job's run (:mod:`.runs`). Readers skip such a record until it reads committed; a
task's read of its marker never waits for one (its key is never a task's). Records and
pointers written plainly (:func:`write_decision`: a batch job run's amendment, sinks
decided before the decider) are read as before.

Moving the pointer is the decision. When the group holds no offset (a new sink, or its
offsets expired), the log's last record stands for the pointer: tasks and driver judge
by the same rule. ``eos sinks reset`` clears both (:mod:`.admin`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from eos_connectors.core.kafka_config import logged
from eos_connectors.core.kept import Kept
from eos_connectors.core.secrets import settings_digest
from eos_connectors.core.topics import Record, read_to_end
from eos_connectors.sinks.kafka.clients import CALL_LIMIT, CALL_TIMEOUT, call
from eos_connectors.sinks.kafka.coordinator import OpenTransaction
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.marker import MarkerGroup, marker_consumer
from eos_connectors.sinks.kafka.marker_log import read_for
from eos_connectors.sinks.kafka.options import KafkaSinkOptions, marker_group

DECISION_SUFFIX = "-decision"
#: A decider's transaction holds one record and one offset for milliseconds; a driver
#: that dies inside it holds read_committed readers of the marker log back at most this
#: long (the next claim ends it at once).
DECIDER_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class Decision:
    """A decided batch: every task partition's transaction, as the marker log keeps it."""

    batch: int
    query: str
    txns: dict[int, OpenTransaction]
    records: int = 0
    #: Task partitions whose decided transaction the coordinator aborted before the
    #: driver committed it: the replay writes them again, and its commit names the new
    #: transactions (an amended decision of the same batch).
    rewrite: tuple[int, ...] = ()
    #: The claim (the decider's producer id and epoch) the decision was written under,
    #: in the decider's transaction (:mod:`.stream_decider`, :mod:`.runs`); None when
    #: written plainly.
    claim: tuple[int, int] | None = None
    #: A stream's batch: the digest of the source positions its ``offsets/N`` planned
    #: (``core.checkpoint_behind``); "" when unknown.
    offsets: str = ""

    def encode(self) -> bytes:
        named = {p: [t.transactional_id, t.producer_id, t.epoch] for p, t in self.txns.items()}
        body = {"eos": "decision", "batch": self.batch, "query": self.query, "txns": named}
        extra = {"records": self.records, "rewrite": list(self.rewrite)}
        claimed = {"claim": list(self.claim)} if self.claim is not None else {}
        planned = {"offsets": self.offsets} if self.offsets else {}
        return json.dumps({**body, **extra, **claimed, **planned}, sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> Decision | None:
        try:
            body = json.loads(value)
            if body.get("eos") != "decision":
                return None
            txns = {
                int(p): OpenTransaction(str(t[0]), int(t[1]), int(t[2]))
                for p, t in body["txns"].items()
            }
            rewrite = tuple(int(p) for p in body.get("rewrite", ()))
            records = int(body.get("records", 0))
            claim = body.get("claim")
            claimed = (int(claim[0]), int(claim[1])) if claim is not None else None
            offsets = str(body.get("offsets", ""))
            batch, query = int(body["batch"]), str(body["query"])
            return cls(batch, query, txns, records, rewrite, claimed, offsets)
        except (ValueError, KeyError, TypeError, IndexError):
            return None


def decision_group(options: KafkaSinkOptions, sink_id: str) -> str:
    """The group whose committed offset on the marker topic is the last decided batch + 1."""
    return f"{options.transactional_id_prefix}-{sink_id}{DECISION_SUFFIX}"


def read_pointer(
    options: KafkaSinkOptions, sid: str, reader: MarkerGroup | None = None, stable: bool = False
) -> tuple[int, str] | None:
    """The decision pointer: (last decided batch + 1, query id), None before any. When
    the group holds no offset (a new sink, or its offsets expired), the marker log's last
    decision record stands for it, counted once committed (:func:`_decisions`): tasks and
    driver judge by the same rule. ``reader``: the decision group's kept marker group (a
    task's), else a consumer made for the read; ``stable``: waiting for a pointer a
    decision moved in a transaction that committed but is not applied yet."""
    group = decision_group(options, sid)
    if reader is not None:
        pointed = reader.read_quick()
    else:
        pointed = _read_kept(options, group, "read_committed" if stable else "read_uncommitted")
    if pointed is not None:
        return pointed
    return last_logged(options, sid)


def last_logged(options: KafkaSinkOptions, sid: str) -> tuple[int, str] | None:
    """What stands for the pointer when its group holds no offset: the marker log's last
    decision of the sink (batch + 1, query id), None before any."""
    decisions = _decisions(options, sid)
    return (decisions[-1].batch + 1, decisions[-1].query) if decisions else None


def _decisions(options: KafkaSinkOptions, sid: str) -> list[Decision]:
    """The sink's decision records in the marker log, oldest first, none before its last
    tombstone (``eos sinks reset``); read_uncommitted first (plain records, and other
    sinks' transactional records have other keys). A record written in the decider's
    transaction counts only once committed (read again read_committed, only when the log
    holds one, waiting for the transactions open before it when it lies past the last
    stable offset), so a driver or run fenced mid-decision by a later claimer never
    passes for the decision, and a committed one never passes for aborted."""
    key = decision_group(options, sid).encode()
    records = read_to_end(options.client_config(), options.marker_log, "read_uncommitted")
    found: list[tuple[int, Decision]] = []
    for record in (r for r in records if r.key == key):
        if not record.value:
            found = []
            continue
        decision = Decision.decode(record.value)
        if decision is not None:
            found.append((record.offset, decision))
    if any(d.claim is not None for _, d in found):
        # A record behind the log's last stable offset is not aborted but unknown yet:
        # another client's transaction that began before it is still open (a task-mode
        # sink's marker, or one left hanging). read_for waits for it in that case only.
        what = f"the decisions of sink {sid} (behind a transaction open on the log)"
        committed = {r.offset for r in read_for(options, key.__eq__, what) if r.key == key}
        found = [(o, d) for o, d in found if d.claim is None or o in committed]
    return [d for _, d in found]


def decided_by_query(
    options: KafkaSinkOptions, query_id: str, records: list[Record]
) -> dict[str, int]:
    """Driver: sink id -> its last decided batch, for every sink on the marker log (under
    the transactional id prefix) whose decision pointer names ``query_id``. The decision
    records among ``records`` (the marker log read uncommitted, so that a record behind
    another query's open transaction is seen) name the candidates; each candidate's
    pointer (:func:`read_pointer`: its group's committed offset, else the log's committed
    decisions) decides."""
    prefix, suffix = f"{options.transactional_id_prefix}-", DECISION_SUFFIX
    candidates: set[str] = set()
    for record in records:
        key = (record.key or b"").decode(errors="replace")
        if not (key.startswith(prefix) and key.endswith(suffix) and record.value):
            continue
        decision = Decision.decode(record.value)
        if decision is not None and decision.query == query_id:
            candidates.add(key[len(prefix) : -len(suffix)])
    found: dict[str, int] = {}
    for sid in sorted(candidates):
        pointed = read_pointer(options, sid)
        if pointed is not None and pointed[1] == query_id:
            found[sid] = pointed[0] - 1
    return found


def decision_record(options: KafkaSinkOptions, sid: str, decision: Decision) -> tuple[str, bytes]:
    """(key, value) of ``decision``'s record in the marker log (partition 0)."""
    return decision_group(options, sid), decision.encode()


def read_marker(
    options: KafkaSinkOptions, group: str, isolation: str = "read_uncommitted"
) -> tuple[int, str] | None:
    """A group's committed offset on the marker topic, as the group applied it (under
    read_committed: once no transaction's offsets for it are pending)."""
    consumer = marker_consumer(options, group, isolation)
    try:
        return _committed(options, group, consumer)
    finally:
        consumer.close()


def uncommitted(options: KafkaSinkOptions, decision: Decision) -> list[int]:
    """Driver: the task partitions whose transaction ``decision`` names and that has not
    committed: its marker group (the id without its attempt slot), as the group applied
    it, not past the decided batch."""
    left = []
    for partition, txn in sorted(decision.txns.items()):
        marked = read_marker(options, marker_group(txn.transactional_id))
        if marked is None or marked[0] <= decision.batch:
            left.append(partition)
    return left


def _read_kept(options: KafkaSinkOptions, group: str, isolation: str) -> tuple[int, str] | None:
    """Driver: :func:`read_marker` through a consumer this process keeps for the group. A
    commit reads its sink's pointer every batch; a consumer made for each read took about
    4 ms of the driver's ~15 ms commit step (a commit's Python worker is kept by Spark)."""
    key = settings_digest({**options.client_config(), "group.id": group, "isolation": isolation})
    with _READERS.lent(key, lambda: marker_consumer(options, group, isolation)) as consumer:
        return _committed(options, group, consumer)


def _committed(options: KafkaSinkOptions, group: str, consumer: Consumer) -> tuple[int, str] | None:
    """The group's committed offset on the marker topic's partition 0, asked of its
    coordinator (a consumer never answers from a cache)."""
    position = TopicPartition(options.marker_topic, 0)
    answer = call(lambda: consumer.committed([position], timeout=CALL_TIMEOUT), f"reading {group}")
    found = answer[0]
    if found.error is not None:
        raise KafkaSinkError(
            f"Reading {group} on {options.marker_topic} failed: {found.error.str()}."
        )
    return None if found.offset < 0 else (int(found.offset), found.metadata or "")


def write_decision(options: KafkaSinkOptions, sid: str, decision: Decision) -> Decision:
    """Driver, a batch job run's amended decision (:mod:`.runs`): the decision record in the
    marker log, then the pointer, written plainly; returns ``decision``. A stream decides
    under its claim of the decider instead (:mod:`.stream_decider`)."""
    group = decision_group(options, sid)
    settings = options.client_config()
    with _DECIDERS.lent(settings_digest(settings), lambda: _decider(settings)) as producer:
        producer.produce(options.marker_log, decision.encode(), group.encode(), partition=0)
        if producer.flush(CALL_TIMEOUT):
            raise KafkaSinkError(
                f"The decision of batch {decision.batch} was not written to "
                f"{options.marker_log}; nothing was committed."
            )
    pointer = TopicPartition(options.marker_topic, 0, decision.batch + 1, metadata=decision.query)
    committer = {**settings, "group.id": group, "enable.auto.commit": False}
    with _POINTERS.lent(settings_digest(committer), lambda: Consumer(logged(committer))) as c:
        call(
            lambda: c.commit(offsets=[pointer], asynchronous=False),
            f"deciding batch {decision.batch}",
        )
    return decision


def write_in_transaction(
    options: KafkaSinkOptions,
    sid: str,
    producer: Producer,
    pointer: MarkerGroup,
    decision: Decision,
    pointer_limit: float = CALL_LIMIT,
) -> None:
    """Driver: ``decision``'s record and the pointer's move (through ``pointer``, the
    decision group) in one transaction of ``producer``, a claimed decider (a stream's:
    :mod:`.stream_decider`; a batch job run's: :mod:`.runs`). The pointer's move is given
    up after ``pointer_limit`` seconds (:func:`~.clients.bounded`). The caller judges a
    failure: fenced means a later claimer aborted the transaction."""
    key, value = decision_record(options, sid, decision)
    call(producer.begin_transaction, "beginning the decision")
    producer.produce(options.marker_log, value, key.encode(), partition=0)
    pointer.join(
        producer, decision.batch + 1, decision.query, "moving the decision pointer", pointer_limit
    )
    call(lambda: producer.commit_transaction(CALL_TIMEOUT), "committing the decision")


def decider_settings(options: KafkaSinkOptions, sid: str) -> dict[str, Any]:
    """The producer settings of the sink's decider, the transactional id both a stream's
    driver (:mod:`.stream_decider`) and a batch job's run (:mod:`.runs`) claim."""
    return {
        **options.client_config(),
        "transactional.id": decision_group(options, sid),
        "transaction.timeout.ms": DECIDER_TIMEOUT_MS,
        "acks": "all",
    }


def _decider(settings: dict[str, Any]) -> Producer:
    """The producer of decision records: one record a decision, so no idempotence (a
    repeated record says the same; an idempotent producer's first send waits ~500 ms for
    its producer id), acks from every in-sync replica."""
    return Producer(logged({**settings, "enable.idempotence": False, "acks": "all"}))


def _purge(producer: Producer) -> None:
    """A failed decision writer's queue emptied, so no record lands after its batch failed."""
    producer.purge()


#: This driver process's decision writers, kept across its commits (Spark runs a query's
#: commits in one Python worker it keeps): the marker log's producer by client
#: settings, each sink's pointer committer by settings and group.
_DECIDERS: Kept[Producer] = Kept(_purge, size=8)
_POINTERS: Kept[Consumer] = Kept(Consumer.close, size=64)
#: Its pointer readers, by settings, group and isolation (:func:`_read_kept`).
_READERS: Kept[Consumer] = Kept(Consumer.close, size=64)


def decided_over(options: KafkaSinkOptions, sid: str, batch: int) -> str:
    """Driver: the source positions' digest the decision of ``batch`` recorded; "" when
    the marker log holds no decision of it, or one written before digests were kept."""
    found = _decision_of(options, sid, batch)
    return "" if found is None else found.offsets


def _decision_of(options: KafkaSinkOptions, sid: str, batch: int) -> Decision | None:
    """The sink's last decision record of ``batch`` in the marker log, if any."""
    mine = [d for d in _decisions(options, sid) if d.batch == batch]
    return mine[-1] if mine else None


def read_decision(options: KafkaSinkOptions, sid: str, batch: int) -> Decision:
    """Driver: the decision of ``batch`` from the marker log (after a driver's restart)."""
    found = _decision_of(options, sid, batch)
    if found is None:
        key = decision_group(options, sid)
        raise KafkaSinkError(
            f"Batch {batch} is decided (the pointer {key!r} says so) but the marker log "
            f"{options.marker_log!r} holds no decision of it, so its transactions are unknown; "
            "they are aborted by their timeout. Nothing of the batch is visible."
        )
    return found
