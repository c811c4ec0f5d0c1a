"""Driver: the runs of a batch job (``df.write`` with ``sinkId``/``txnVersion``) in the Kafka
sink's batch commit claim their version, so that two runs of one version at the same time
(a scheduler that retries a job while its first attempt still runs) never mix.

A run **claims** the job's *decider*, the transactional id ``<prefix>-<sink id>-decision``,
on its driver before any of its tasks runs (:func:`claim_run`): ``InitProducerId`` hands
it the id's next epoch and fences every earlier claim. The claim gives the run two
things:

* **Ids of its own.** Its tasks' transactional ids are ``<prefix>-<sink id>-<task
  partition>r<slot>`` (then each attempt's slot, ``a<slot>``:
  :func:`.options.attempt_slot`), the slot being the claim's epoch modulo :data:`POOL`. With the
  stream's ids (one per task partition), a task of the later run would fence, so abort,
  the earlier run's transaction of its task partition; once the earlier run had decided,
  that task partition would end up written by the other run, in that run's split of the
  rows (records twice or never). Two live runs now never touch each other's
  transactions. The pool bounds what a job leaves at the transaction coordinators to
  ``POOL`` ids per task partition; runs ``POOL`` claims apart share ids, and then the
  later fences the earlier as before (the earlier cannot decide any more anyway, below).
* **The only decision.** The run's commit (:func:`decide`) first checks that the
  decider's epoch is still its claim's (no later run claimed the version), then claims
  the decider again and must be given exactly the next epoch, then writes the decision
  record and moves the pointer (:mod:`.decisions`) in one transaction of the decider.
  Any later claim, even between that check and the transaction's commit (a driver that
  paused there), fences the transaction: the record is aborted (readers of the log skip
  it) and the pointer does not move. A run that lost its claim aborts its own open
  transactions (its slot's, never the later run's) and fails, naming the reason; the
  version is the later run's to decide. So the last run to start decides; an earlier one
  still running fails, and a later one that finds the version decided writes nothing.

Each run takes two epochs (its claim, its commit's). When the decider's epoch reaches
the protocol's maximum (after ~16,000 runs of the job), the coordinator gives it a new
producer id, and the one run that straddles the change fails as if superseded: its
rerun writes the version.

A stream's driver claims the same id too, once per driver process rather than per run,
and decides in its transactions likewise (:mod:`.stream_decider`): a stream has one run
at a time, but a driver of an earlier run may wake after the next took over.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import NoReturn

from confluent_kafka import Producer

from eos_connectors.core.kafka_config import logged
from eos_connectors.sinks.kafka.clients import CALL_TIMEOUT, call, is_fenced
from eos_connectors.sinks.kafka.coordinator import TransactionClient, kept_client
from eos_connectors.sinks.kafka.decisions import (
    Decision,
    decider_settings,
    decision_group,
    write_in_transaction,
)
from eos_connectors.sinks.kafka.errors import KafkaSinkError
from eos_connectors.sinks.kafka.marker import MarkerGroup
from eos_connectors.sinks.kafka.options import KafkaSinkOptions, ids_prefix
from eos_connectors.sinks.kafka.txn_identity import Identity

log = logging.getLogger(__name__)

#: How many id sets (slots) a job's runs take turns with.
POOL = 8
#: How long a driver waits for its decider's statistics to show its producer id.
IDENTITY_TIMEOUT = 30.0


class RunSupersededError(KafkaSinkError):
    """A later run of the same batch job claimed its version before this run decided."""


@dataclass(frozen=True)
class RunClaim:
    """A run's claim of its job's decider: the producer id and epoch it was given."""

    producer_id: int
    epoch: int

    @property
    def slot(self) -> int:
        """The run's set of transactional ids (:data:`POOL` of them take turns)."""
        return self.epoch % POOL

    @property
    def pair(self) -> tuple[int, int]:
        return self.producer_id, self.epoch


def claim_run(options: KafkaSinkOptions, sid: str) -> RunClaim:
    """Driver, before any task of a batch job's run: the decider claimed for this run
    (every earlier claim fenced, an earlier run's decision transaction ended first)."""
    producer, identity = _decider(options, sid)
    ready = identity.ready(producer, decision_group(options, sid), IDENTITY_TIMEOUT)
    claim = RunClaim(ready.producer_id, ready.epoch)
    log.info("sink %s: this run claimed its version (decider epoch %d)", sid, claim.epoch)
    return claim


def decide(options: KafkaSinkOptions, sid: str, claim: RunClaim, decision: Decision) -> Decision:
    """Driver, a batch job run's decision: written and the pointer moved in one transaction
    of the decider, only while ``claim`` is the newest; else the run's own open
    transactions are aborted and :class:`RunSupersededError` raised. Returns the decision
    as written (with the claim it was decided under)."""
    name = decision_group(options, sid)
    with kept_client(options.kafka) as client:
        _check_newest(client, options, sid, claim)
    producer, identity = _decider(options, sid)
    again = identity.ready(producer, name, IDENTITY_TIMEOUT)
    if (again.producer_id, again.epoch) != (claim.producer_id, claim.epoch + 1):
        _superseded(options, sid, claim, f"the decider moved to epoch {again.epoch}")
    decided = replace(decision, claim=(again.producer_id, again.epoch))
    pointer = MarkerGroup(options, name)
    try:
        write_in_transaction(options, sid, producer, pointer, decided)
    except KafkaSinkError as exc:
        if is_fenced(exc):  # a later claim aborted the decision's transaction
            _superseded(options, sid, claim, f"its decision was fenced: {exc}")
        raise KafkaSinkError(
            f"The decision of version {decision.batch} of job {sid!r} may not have been "
            f"written ({exc}). Its transactions are left to the next run of the job: it "
            "commits them if the decision was written, else writes the version again."
        ) from exc
    finally:
        pointer.close()
    return decided


def _check_newest(
    client: TransactionClient, options: KafkaSinkOptions, sid: str, claim: RunClaim
) -> None:
    """Driver: the decider's producer id and epoch are still ``claim``'s, asked of its
    coordinator before this commit claims it again (a claim would fence a later run)."""
    from kafka.errors import TransactionalIdNotFoundError

    name = decision_group(options, sid)
    try:
        described = client.describe([name]).get(name)
    except TransactionalIdNotFoundError:  # expired, or removed: no claim stands
        described = None
    found = (getattr(described, "producer_id", -1), getattr(described, "producer_epoch", -1))
    if found != claim.pair:
        _superseded(options, sid, claim, f"the decider is at epoch {found[1]}")


def _superseded(options: KafkaSinkOptions, sid: str, claim: RunClaim, why: str) -> NoReturn:
    """Driver: this run's open transactions (its slot's) aborted, and the run fails."""
    with kept_client(options.kafka) as client:
        aborted = client.sweep(ids_prefix(options, sid), [], slot=claim.slot)
    raise RunSupersededError(
        f"Another run of this version of job {sid!r} started after this one "
        f"(claim epoch {claim.epoch}; {why}), so this run does not decide it: its "
        f"{len(aborted)} open transactions were aborted and nothing of it is visible. The "
        "later run decides the version; a run started after that writes nothing. Run one "
        "attempt of a version at a time (a scheduler's retry after the first attempt ended)."
    )


def _decider(options: KafkaSinkOptions, sid: str) -> tuple[Producer, Identity]:
    """Driver: a producer of the decider's id, initialised (which fences every earlier
    one), with its statistics watched for the epoch it was given."""
    identity = Identity()
    producer = Producer(logged({**decider_settings(options, sid), **identity.settings()}))
    try:
        call(lambda: producer.init_transactions(CALL_TIMEOUT), "claiming the decider")
    except KafkaSinkError as exc:
        raise KafkaSinkError(
            f"Sink {sid}: the batch job's decider ({decision_group(options, sid)!r}) could "
            f"not be claimed: {exc}. Nothing was written; run the job again."
        ) from exc
    return producer, identity
