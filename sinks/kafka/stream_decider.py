"""Driver: a stream's decisions in the Kafka sink's batch commit, written as a
compare-and-set on the decision pointer.

A driver reads the pointer, decides, then moves it. A driver of an earlier run that
read the pointer and paused before its decision (frozen, and replaced by the cluster
manager) would, on waking, move a plain offset back past the next run's decisions. So a
stream's driver process **claims** the sink's decider, the transactional id
``<prefix>-<sink id>-decision``, before its first look at the pointer:
``init_transactions()`` gives it the id's next epoch, fences every earlier claimer and
ends any decision transaction one left open. Every decision of the process is then
written, record and pointer, in one transaction of that producer. A claimer that came
later fences it: its transaction is aborted, the pointer does not move, and
:class:`DeciderFencedError` sends the commit back to claim again and read the pointer
anew (:func:`deciding`). So a decision is written only by a driver whose claim is the
newest and who read the pointer after it: a woken driver of an earlier run finds the
next run's decisions and never moves the pointer back.

The claim is kept with the process (Spark keeps a query's commit worker), so a batch
pays one short transaction, not an ``InitProducerId``; but not across a broker's death
(its producer lost a connection) nor past a call that never returned: librdkafka can wait
for a coordinator it lost for good (:data:`~.clients.SEND_OFFSETS_LIMIT`), and a new
claim starts from fresh metadata and ends the stuck one's transaction.

Two live drivers (a woken one and the current one; or two kept workers Spark lends in
turn) each claim again when fenced, and each reads the truth after its claim; the woken
one's query stops at its next write to the checkpoint. A batch job's runs claim the
same id per run instead (:mod:`.runs`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace

from confluent_kafka import Producer

from eos_connectors.core.kafka_config import logged
from eos_connectors.core.kept import Kept
from eos_connectors.core.secrets import settings_digest
from eos_connectors.sinks.kafka.clients import (
    CALL_TIMEOUT,
    SEND_OFFSETS_LIMIT,
    BrokerLoss,
    StuckCallError,
    call,
    is_fenced,
)
from eos_connectors.sinks.kafka.coordinator import (
    COORDINATOR_WAIT_S,
    CallTime,
    OpenTransaction,
    describe_when_ready,
    kept_client,
)
from eos_connectors.sinks.kafka.decisions import (
    Decision,
    decider_settings,
    decision_group,
    last_logged,
    read_decision,
    write_in_transaction,
)
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.marker import MarkerGroup
from eos_connectors.sinks.kafka.options import KafkaSinkOptions, ids_prefix

log = logging.getLogger(__name__)

#: How many claims one commit tries (a claim is spent when fenced, when its producer
#: lost a broker connection, or when its decision's transaction failed).
CLAIMS = 5

#: What a commit does with the pointer it read under its claim: (the pointer, a
#: function that writes a decision) -> the batch's decision.
Choose = Callable[[tuple[int, str] | None, Callable[[Decision], Decision]], Decision]


class ClaimSpentError(KafkaSinkError):
    """This driver's claim of the decider is not to be used again: the commit claims
    again and reads the pointer anew, which tells whether anything was decided under
    it."""


class DecisionFailedError(ClaimSpentError):
    """The decision's transaction failed or its call never returned; whether it committed
    is read after the next claim."""


class DeciderFencedError(ClaimSpentError):
    """A later claimer of the sink's decider fenced this driver's decision transaction:
    nothing was written and the pointer did not move."""


@dataclass
class Decider:
    """A driver process's claim of one sink's decider: its producer and the pointer's
    group (stable reads; the group metadata of the pointer's move)."""

    options: KafkaSinkOptions
    sid: str
    producer: Producer
    pointer: MarkerGroup
    claim: tuple[int, int]
    #: What the producer's error callback saw: a claim kept across a broker's death is
    #: never used again (librdkafka may wait for a lost coordinator for good).
    loss: BrokerLoss
    #: A call of the producer never returned: it is left to the thread that waits in it.
    stuck: bool = False

    def check(self) -> None:
        """Before a use: :class:`ClaimSpentError` when the producer lost a broker connection
        since it was claimed (its callbacks served first)."""
        self.producer.poll(0)
        if self.loss.seen:
            raise ClaimSpentError(
                f"Sink {self.sid}: the driver's claim of the decider lost a broker "
                "connection since its last decision"
            )

    def read(self) -> tuple[int, str] | None:
        """The pointer, read stably (after any decision transaction that committed is
        applied); with no offset in the group, the marker log's last decision."""
        pointed = self.pointer.read_stable()
        if pointed is not None:
            return pointed
        return last_logged(self.options, self.sid)

    def write(self, decision: Decision) -> Decision:
        """The decision record and the pointer's move, in one transaction; returns the
        decision as written. :class:`DeciderFencedError` when a later claim fenced it."""
        decided = replace(decision, claim=self.claim)
        try:
            write_in_transaction(
                self.options, self.sid, self.producer, self.pointer, decided, SEND_OFFSETS_LIMIT
            )
        except StuckCallError as exc:
            self.stuck = True  # nothing committed: the next claim aborts its transaction
            raise DecisionFailedError(f"Sink {self.sid}: {exc}") from exc
        except KafkaSinkError as exc:
            if is_fenced(exc):
                raise DeciderFencedError(
                    f"Sink {self.sid}: another driver claimed the decider after this one "
                    f"(claim epoch {self.claim[1]}); the decision of batch "
                    f"{decision.batch} was not written."
                ) from exc
            # Its outcome may be unknown (a commit that failed after it was sent): the next
            # claim's InitProducerId waits for the transaction to end either way, and the
            # pointer read after it tells which.
            raise DecisionFailedError(
                f"Sink {self.sid}: the decision of batch {decision.batch} failed ({exc})"
            ) from exc
        return decided

    def close(self) -> None:
        self.pointer.close()
        if not self.stuck:
            self.producer.purge()


def deciding(options: KafkaSinkOptions, sid: str, choose: Choose) -> Decision:
    """Driver: ``choose`` run with the pointer read under this process's newest claim of
    the decider, and a writer of decisions under it; claimed again and run again when the
    writer was fenced by a later claimer or its transaction failed (at most
    :data:`CLAIMS` times). Safe to repeat: each try reads the pointer after its claim,
    which waits for any earlier try's transaction to end."""
    last: ClaimSpentError | None = None
    for attempt in range(CLAIMS):
        try:
            with _lent(options, sid) as decider:
                decider.check()
                return choose(decider.read(), decider.write)
        except ClaimSpentError as exc:  # the pool closed that claim
            last = exc
            level = logging.WARNING if isinstance(exc, DecisionFailedError) else logging.INFO
            log.log(level, "%s; claiming it again (try %d of %d)", exc, attempt + 2, CLAIMS)
    raise KafkaSinkError(
        f"Sink {sid}: no decision could be written under a claim of the decider "
        f"{decision_group(options, sid)!r} in {CLAIMS} tries (last: {last}). The query's "
        "restart claims it again and reads whether the batch was decided, so nothing is "
        "lost or written twice. If another query, or another run of this one, writes with "
        "the same sinkId and checkpoint, stop it."
    )


def claim_at_start(options: KafkaSinkOptions, checkpoint: str | None) -> None:
    """Driver, at a stream's start: the decider claimed (and kept for this process's
    commits) for the sink id of the query the ``checkpoint`` names, so that a driver of
    an earlier run is fenced before this run's first batch and the driver's WRITE on
    the id is known at once; then the sink's strays swept (:func:`sweep_at_start`).
    Nothing happens when the checkpoint cannot be read here: the first commit claims. A
    claim refused fails the start, naming the fallback."""
    from eos_connectors.core.checkpoint_sinks import checkpoint_query_id

    query_id = checkpoint_query_id(checkpoint)
    if query_id is None:
        return
    sweep_at_start(options, options.sink_id_for(query_id), query_id)


def sweep_at_start(
    options: KafkaSinkOptions, sid: str, query_id: str
) -> list[OpenTransaction] | None:
    """Driver, at a stream's start, under its claim of the decider (claimed here if this
    process has none yet: every earlier driver fenced), the pointer read through it: the
    sink's open transactions that its last decision does not name aborted
    (an attempt that wrote after the previous run's last commit, which no later commit
    swept: a zombie woken then, the attempt Spark did not keep). The last decision's are
    kept: the previous driver may have died before its commits, which the replay
    finishes. Only the query's own sink: a pointer of another query (a sink id not yet
    reset) is left alone. Best effort, as the commits' sweep: None when a broker did not
    answer, else what was aborted."""
    called = CallTime.now()
    with _lent(options, sid) as decider:
        pointed = decider.read()
    if pointed is None or pointed[1] != query_id:
        return []
    keep = list(read_decision(options, sid, pointed[0] - 1).txns.values())
    with kept_client(options.kafka) as client:
        stray = client.sweep_if_reachable(ids_prefix(options, sid), keep, called)
    if stray:
        log.info("sink %s: aborted %d open transactions at start", sid, len(stray))
    return stray


def _lent(options: KafkaSinkOptions, sid: str) -> AbstractContextManager[Decider]:
    """Driver: this process's claim of ``sid``'s decider, claimed on first use."""
    key = settings_digest({**options.client_config(), "decider": decision_group(options, sid)})
    return _KEPT.lent(key, lambda: _claim(options, sid))


def _claim(options: KafkaSinkOptions, sid: str) -> Decider:
    """Driver: the decider claimed for this process (every earlier claimer fenced, a
    decision transaction one left open ended) and its epoch asked of the coordinator."""
    name = decision_group(options, sid)
    loss = BrokerLoss()
    producer = Producer(logged({**decider_settings(options, sid), "error_cb": loss}))
    try:
        call(lambda: producer.init_transactions(CALL_TIMEOUT), "claiming the decider")
        with kept_client(options.kafka) as client:  # its coordinator may just have moved
            described = describe_when_ready(client, name, time.monotonic() + COORDINATOR_WAIT_S)
    except Exception as exc:
        producer.purge()
        raise KafkaSinkError(
            f"Sink {sid}: the driver could not claim the sink's decider, the transactional "
            f"id {name!r} ({exc}). The batch commit's driver needs WRITE and DESCRIBE on "
            "the sink's transactional ids; grant them, or use commitMode=task. Nothing of "
            "the batch was decided or is visible."
        ) from exc
    claim = (getattr(described, "producer_id", -1), getattr(described, "producer_epoch", -1))
    log.info("sink %s: this driver claimed its decider (epoch %d)", sid, claim[1])
    return Decider(options, sid, producer, MarkerGroup(options, name), claim, loss)


#: This driver process's claims, by settings and sink (Spark keeps a query's commit
#: worker, so a claim lasts across its commits); one that failed is made again.
_KEPT: Kept[Decider] = Kept(Decider.close, size=8)
