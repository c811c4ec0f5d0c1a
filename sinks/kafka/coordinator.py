"""Driver: end transactions that the Kafka sink's tasks left open, as their coordinator's
participant (issue 53: the batch commit).

A transaction a task's librdkafka producer opened, wrote and flushed stays open when the
task returns (librdkafka neither commits nor aborts on exit). Any client that knows its
transactional id, producer id and epoch can end it: ``EndTxn`` sent to the id's
transaction coordinator, which writes the commit (or abort) markers to every partition
the transaction touched. This is what Flink's Kafka committer does through the Java
producer; here it is one request per transaction from the driver, after the batch's
decision.

Why kafka-python: librdkafka has no call that ends another producer's transaction, and
KIP-939's prepare/complete API is in no Kafka release. kafka-python 3.0 is a maintained
pure-Python client with the protocol's schemas (``EndTxnRequest``), FindCoordinator for
transactional ids and KIP-664's DescribeTransactions, over the same SASL and TLS
listeners (:func:`~eos_connectors.core.kafka_config.to_kafka_python` translates the
sink's one librdkafka dict). This module is the only user of its internals (the admin
client's connection manager and coordinator cache); :func:`check_client` fails at start
if an upgrade moved them, and the dependency is pinned to the minor version.

``EndTxn`` is pinned to version 3 (:data:`END_TXN_VERSION`): librdkafka speaks
transaction protocol version 1 on every broker (one epoch per producer session, bumped
only by ``InitProducerId``); version 5 is KIP-890's transaction version 2, whose epoch
moves with every transaction. The answers (checked against Kafka 4.3):

* ``NONE``: committed (or aborted); a repeat of the same end answers ``NONE`` again;
* ``CONCURRENT_TRANSACTIONS``, ``COORDINATOR_LOAD_IN_PROGRESS``, ``NOT_COORDINATOR``,
  ``COORDINATOR_NOT_AVAILABLE``: asked again (the coordinator looked up again) until
  the deadline;
* ``INVALID_PRODUCER_EPOCH``, ``PRODUCER_FENCED``: the id was initialised again since
  (a zombie, the timeout's abort bumps the epoch too): :class:`TransactionFencedError`.
  The caller never takes an answer alone for what happened to the records: a decided
  transaction found fenced is checked by its marker (the records it wrote are there,
  committed, or not);
* ``INVALID_TXN_STATE``: the transaction ended the other way at its own epoch (an abort
  after a commit, or a commit after another client's abort, which moves no epoch):
  :class:`TransactionEndedError`, judged by its marker as a fenced one is;
* ``INVALID_PRODUCER_ID_MAPPING``: the coordinator forgot the id (it expired, days after
  its last transaction ended: a driver restarted that late): the same.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from functools import partial
from typing import Any

from eos_connectors.core.errors import EosError
from eos_connectors.core.kafka_config import FALLBACK_HINT, KafkaConfig, bootstrap, to_kafka_python
from eos_connectors.core.kept import Kept
from eos_connectors.core.secrets import settings_digest

#: The EndTxn request version the driver sends: transaction protocol version 1, as the
#: tasks' librdkafka speaks it.
END_TXN_VERSION = 3
#: Answers after which the same request is sent again (the coordinator moved, is loading,
#: or still writes the markers of the previous end).
RETRIABLE = frozenset(
    {"CONCURRENT_TRANSACTIONS", "COORDINATOR_LOAD_IN_PROGRESS", "NOT_COORDINATOR"}
    | {"COORDINATOR_NOT_AVAILABLE", "NODE_NOT_READY"}
)
FENCED = frozenset({"INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED"})
#: The coordinator no longer knows the transactional id: it expired after
#: ``transactional.id.expiration.ms`` without a transaction (7 days by default), long
#: after its last transaction ended, one way or the other.
FORGOTTEN = "INVALID_PRODUCER_ID_MAPPING"
ENDED_OTHERWISE = frozenset({"INVALID_TXN_STATE", FORGOTTEN})
#: Requests the driver's client keeps in flight on one connection; past it a request is
#: sent again in the next round.
MAX_IN_FLIGHT = 1024


@dataclass(frozen=True)
class OpenTransaction:
    """A transaction a task left open: what the driver needs to end it."""

    transactional_id: str
    producer_id: int
    epoch: int


@dataclass(frozen=True)
class CallTime:
    """When a driver's call began, on its wall clock (compared with a coordinator's
    transaction start times when the broker cannot filter by duration) and its monotonic
    clock (how long ago, which a broker compares with its own clock)."""

    wall_ms: int
    monotonic_s: float

    @classmethod
    def now(cls) -> CallTime:
        return cls(int(time.time() * 1000), time.monotonic())

    def elapsed_ms(self) -> int:
        return int((time.monotonic() - self.monotonic_s) * 1000)


class TransactionEndError(EosError):
    """The coordinator refused to end a transaction (``code``: its Kafka error name)."""


class TransactionEndedError(TransactionEndError):
    """The transaction is no longer open at its epoch: it ended the other way (this
    class), or its id was initialised again (:class:`TransactionFencedError`). What became
    of its records is the transaction's marker's to say, never this answer's."""


def begun_again(txn: OpenTransaction) -> TransactionEndedError:
    """The refusal a decided transaction found begun again (:meth:`TransactionClient.rebegun`)
    stands for: it ended the other way at its epoch, as ``INVALID_TXN_STATE`` says."""
    ended = TransactionEndedError(
        f"Transaction {txn.transactional_id!r} (producer {txn.producer_id}, epoch "
        f"{txn.epoch}) was aborted by another client while its task wrote, and its task's "
        "producer then began a new one at the same epoch."
    )
    ended.code = "aborted, begun again"
    return ended


class TransactionFencedError(TransactionEndedError):
    """The transactional id was initialised again after the transaction was opened: the
    producer that opened it is fenced and the coordinator aborted its transaction."""


class _HidesItsSettings(logging.Filter):
    """kafka-python logs an admin client's whole configuration, SASL password included,
    at DEBUG: never let that line out."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Starting KafkaAdminClient with configuration")


logging.getLogger("kafka.admin.client").addFilter(_HidesItsSettings())
log = logging.getLogger(__name__)


def check_client(admin: Any) -> None:
    """Start check: the kafka-python internals this module uses are where it expects."""
    missing = [
        name
        for name, owner in (("_manager", admin), ("_find_coordinator_ids", admin))
        if not hasattr(owner, name)
    ]
    cluster = getattr(getattr(admin, "_manager", None), "cluster", None)
    if cluster is None or not hasattr(cluster, "_coordinators"):
        missing.append("_manager.cluster._coordinators")
    if missing:
        raise TransactionEndError(
            "The installed kafka-python does not offer what the driver's transaction client "
            f"uses ({', '.join(missing)}); install the version the package pins "
            f"or use {FALLBACK_HINT}."
        )


#: Seconds the driver asks a coordinator again while it cannot be reached or is not
#: ready: long enough for a coordinator to move after its broker died (the controller
#: fences the broker after its session timeout, 9 s by default, and the transaction
#: log's new leader loads it). The commits and the start check wait as long: the check
#: runs again in each new driver-side process Spark starts for a running query, and at
#: 15 s it failed the query in a broker's death (the cluster run, in CI).
COORDINATOR_WAIT_S = 30.0


class TransactionClient:
    """Driver: one connection set to the cluster, kept for the query's commits."""

    def __init__(self, config: KafkaConfig, timeout_s: float = COORDINATOR_WAIT_S) -> None:
        from kafka.admin import KafkaAdminClient

        self.where = bootstrap(config)
        self.timeout_s = timeout_s
        settings = to_kafka_python(config)
        tokens = settings.get("sasl_oauth_token_provider")
        if tokens is not None:  # kafka-python retries a failed token silently to its timeout
            tokens.token()  # so a refused or unreachable token endpoint is named here
        self.admin = KafkaAdminClient(
            **settings,
            client_id="eos-transactions",
            request_timeout_ms=int(timeout_s * 1000),
            # A batch's EndTxn requests are independent: all of them in flight at once
            # (200 tasks' in one round trip to each coordinator).
            max_in_flight_requests_per_connection=MAX_IN_FLIGHT,
        )
        check_client(self.admin)

    def close(self) -> None:
        self.admin.close()

    def describe(self, transactional_ids: Sequence[str]) -> dict[str, Any]:
        """Each id's transaction as its coordinator describes it (KIP-664): ``state``,
        ``producer_id``, ``producer_epoch``, ``topic_partitions``. A retriable failure
        forgets the ids' coordinators, so that the next ask looks them up again."""
        import kafka.errors as errors

        try:
            return dict(self.admin.describe_transactions(list(transactional_ids)))
        except errors.KafkaError as exc:
            if exc.retriable:
                self.forget_coordinators(transactional_ids)
            raise

    def rebegun(self, transactions: Sequence[OpenTransaction]) -> list[OpenTransaction]:
        """Those of ``transactions`` that another client ended and their task's producer
        then began again: ongoing at their own producer id and epoch, yet without the
        offsets partition that a task's transaction registers first (its marker's
        offset). Under transaction protocol version 1 an abort moves no epoch, and the
        next partition a producer adds after it begins a new transaction at the same
        epoch, which holds only what the task wrote after the abort. Coordinators that
        cannot answer yet are asked again until the client's deadline."""
        import kafka.errors as errors

        deadline = time.monotonic() + self.timeout_s
        ids = [txn.transactional_id for txn in transactions]
        try:  # one request to each coordinator
            described = described_when_ready(self, ids, deadline)
        except errors.TransactionalIdNotFoundError:  # one expired id fails the whole ask
            described = {}
            for one in ids:
                with suppress(errors.TransactionalIdNotFoundError):  # expired: none open
                    described |= described_when_ready(self, [one], deadline)
        again = [
            txn
            for txn in transactions
            if txn.transactional_id in described and _rebegun(txn, described[txn.transactional_id])
        ]
        if again and not self.sees_offsets_topic():  # found by a partition hidden from it
            raise offsets_topic_hidden(self.where)
        return again

    def sees_offsets_topic(self) -> bool:
        """Whether the client's principal may describe the offsets topic: a coordinator
        lists only the partitions of a transaction that the asker may describe (its
        DESCRIBE ACL on each topic), so without it every transaction looks as if it
        held no offsets partition (:meth:`rebegun`)."""
        from kafka.errors import TopicAuthorizationFailedError

        (found,) = self.admin.describe_topics([OFFSETS_TOPIC])
        return bool(int(found["error_code"]) != TopicAuthorizationFailedError.errno)

    def forget_coordinators(self, transactional_ids: Sequence[str]) -> None:
        """Drop the ids' coordinators from kafka-python's cache, which it never drops by
        itself: a coordinator that died or moved would be asked again until the deadline
        (NOT_COORDINATOR for 30 s failed the cluster run's Kafka query at its start check,
        in CI, after a broker's death had moved the transaction log's leaders)."""
        from kafka.protocol.metadata import CoordinatorType

        cached = self.admin._manager.cluster._coordinators
        for transactional_id in transactional_ids:
            cached.pop((CoordinatorType.TRANSACTION, transactional_id), None)

    def listed(self, states: Sequence[str], running_ms: int | None = None) -> list[str]:
        """Every transactional id whose transaction is in one of ``states`` (KIP-664's
        names: ``Ongoing``, ``PrepareCommit``, ...), asked of every broker, sorted; only
        those running longer than ``running_ms`` by the broker's clock when given (KIP-994,
        Kafka 3.8+: kafka-python raises ``UnsupportedVersionError`` before it asks an
        older broker)."""
        listed = self.admin.list_transactions(
            state_filters=list(states), duration_filter_ms=running_ms
        )
        return sorted({t.transactional_id for found in listed.values() for t in found})

    def _ongoing_before(self, call: CallTime | None) -> tuple[list[str], int | None]:
        """The ongoing transactions' ids, and the start time (driver's wall clock, ms) they
        must still be found to precede: None when there is no ``call``, or when the
        brokers kept only those begun before it by their own clocks (running longer than
        the call has lasted)."""
        if call is None:
            return self.listed(["Ongoing"]), None
        from kafka.errors import UnsupportedVersionError

        try:
            return self.listed(["Ongoing"], running_ms=call.elapsed_ms()), None
        except UnsupportedVersionError:  # Kafka before 3.8: start times, clocks apart
            return self.listed(["Ongoing"]), call.wall_ms

    def open_transactions(
        self, prefix: str, slot: int | None = None, began_before: CallTime | None = None
    ) -> list[OpenTransaction]:
        """Every ongoing transaction whose id is ``prefix`` and a task partition's number,
        alone or with a batch job run's slot (``3``, ``3r5``: ``eos-a-`` never matches sink
        ``a-b``'s ``eos-a-b-0``); only ``slot``'s when given; only those begun before the
        call ``began_before`` when given: the brokers tell by their own clocks (Kafka
        3.8+), else the coordinators' start times are compared with the driver's wall
        clock. Each with the producer id and epoch its coordinator holds now
        (ListTransactions on every broker, then DescribeTransactions)."""
        ongoing, before = self._ongoing_before(began_before)
        mine = [i for i in ongoing if i.startswith(prefix) and _task(i[len(prefix) :], slot)]
        described = self.describe(mine) if mine else {}
        return [
            OpenTransaction(i, d.producer_id, d.producer_epoch)
            for i, d in described.items()
            if str(getattr(d.state, "value", d.state)) == "Ongoing"
            and (before is None or d.transaction_start_time_ms < before)
        ]

    def sweep(
        self,
        prefix: str,
        keep: Sequence[OpenTransaction],
        slot: int | None = None,
        began_before: CallTime | None = None,
        fence_ms: int | None = None,
    ) -> list[OpenTransaction]:
        """Abort every ongoing transaction of the task partitions' ids under ``prefix``
        (only ``slot``'s, only those begun before the call ``began_before``, when given:
        :meth:`open_transactions`) that ``keep`` does not name (by id and epoch): a task
        attempt that died after it wrote, a zombie, a run that lost its version to
        another; by fencing its id when ``fence_ms`` (the transaction timeout to ask for)
        is given (:meth:`fence`). Returns what it aborted; one that ended meanwhile is
        fine."""
        named = {(t.transactional_id, t.producer_id, t.epoch) for t in keep}
        stray = [
            t
            for t in self.open_transactions(prefix, slot, began_before)
            if (t.transactional_id, t.producer_id, t.epoch) not in named
        ]
        for txn in stray:
            try:
                if fence_ms is not None:
                    self.fence([txn], fence_ms)
                else:
                    self.end([txn], commit=False)
            except TransactionEndError as exc:  # ended meanwhile, or fenced by a new attempt
                log.info("open transaction %s ended meanwhile: %s", txn.transactional_id, exc)
        return stray

    def sweep_if_reachable(
        self, prefix: str, keep: Sequence[OpenTransaction], began_before: CallTime | None = None
    ) -> list[OpenTransaction] | None:
        """:meth:`sweep`, or None when a broker could not be asked (dead, restarting, cut
        off: ListTransactions goes to every broker): nothing is aborted then, and the
        next sweep tries again."""
        import kafka.errors as errors

        try:
            return self.sweep(prefix, keep, began_before=began_before)
        except errors.KafkaError as exc:
            # the caller says what it means for its batch (a warning); here only the cause
            log.info("open transactions of %s* not swept: %s", prefix, type(exc).__name__)
            return None

    def end(self, transactions: Sequence[OpenTransaction], commit: bool) -> None:
        """Commit (or abort) each of ``transactions``; the first refusal is raised."""
        refused = self.refusals(transactions, commit)
        if refused:
            raise next(iter(refused.values()))

    def refusals(
        self, transactions: Sequence[OpenTransaction], commit: bool
    ) -> dict[OpenTransaction, TransactionEndError]:
        """Commit (or abort) each of ``transactions``: every request sent before any
        answer is awaited, answers that say "again" retried until the deadline
        (:class:`TransactionEndError` past it). Returns the transactions the coordinators
        refused, each with its refusal."""
        return self._asked(transactions, partial(_end_txn, commit), _ENDS[commit])

    def fence(self, transactions: Sequence[OpenTransaction], timeout_ms: int) -> None:
        """End each of ``transactions`` by fencing its id: ``InitProducerId`` on it, as a
        new producer of the id would send (``timeout_ms``: the transaction timeout it
        asks for), aborts the open transaction and moves the id's epoch, so that the
        producer that opened it is refused whatever it sends next. An ``EndTxn(abort)``
        moves no epoch under transaction protocol version 1, and that producer's next new
        partition would begin a new transaction at the same epoch. The first refusal is
        raised."""
        refused = self._asked(transactions, partial(_init_producer_id, timeout_ms), "fence")
        if refused:
            raise next(iter(refused.values()))

    def _asked(
        self,
        transactions: Sequence[OpenTransaction],
        request_for: Callable[[OpenTransaction], Any],
        doing: str,
    ) -> dict[OpenTransaction, TransactionEndError]:
        """Send ``request_for`` each transaction to its coordinator, all at once, and
        again for those answered "again" until the deadline; the refused ones, each with
        its refusal."""
        deadline = time.monotonic() + self.timeout_s
        pending = list(transactions)
        refused: dict[OpenTransaction, TransactionEndError] = {}
        delay = 0.01
        while pending:
            answers = self.admin._manager.run(self._send_all, pending, request_for)
            again = []
            for txn, error in zip(pending, answers, strict=True):
                if error in RETRIABLE:
                    again.append(txn)
                elif error != "NONE":
                    refused[txn] = _refused(txn, error, doing)
            pending = again
            if pending and time.monotonic() + delay > deadline:
                raise TransactionEndError(
                    f"The transaction coordinators of {self.where} did not {doing} "
                    f"{len(pending)} transaction(s) within {self.timeout_s:.0f} s "
                    f"(first: {pending[0].transactional_id!r})."
                )
            if pending:
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        return refused

    async def _send_all(
        self, transactions: Sequence[OpenTransaction], request_for: Callable[[OpenTransaction], Any]
    ) -> list[str]:
        """Runs on kafka-python's loop: one request per transaction, to its coordinator."""
        import kafka.errors as errors
        from kafka.protocol.metadata import CoordinatorType

        ids = [txn.transactional_id for txn in transactions]
        try:  # one FindCoordinator for every id not cached (v4, Kafka 3.0+)
            nodes = await self.admin._find_coordinator_ids(
                ids, key_type=CoordinatorType.TRANSACTION
            )
        except errors.KafkaError as exc:  # a coordinator moving (a broker died): again
            if not exc.retriable:
                raise
            return ["COORDINATOR_NOT_AVAILABLE"] * len(transactions)
        futures = [
            self.admin._manager.send(request_for(txn), node_id=nodes[txn.transactional_id])
            for txn in transactions
        ]
        answers = []
        for txn, future in zip(transactions, futures, strict=True):
            try:
                response = await future
                name = str(errors.for_code(response.error_code).message)
            except errors.NodeNotReadyError:  # more than MAX_IN_FLIGHT: the next round
                name = "NODE_NOT_READY"
            except (errors.KafkaConnectionError, errors.RequestTimedOutError):
                name = "COORDINATOR_NOT_AVAILABLE"
            answers.append("NONE" if name == "NO_ERROR" else name)
            if answers[-1] in RETRIABLE:
                self.forget_coordinators([txn.transactional_id])
        return answers


#: This driver process's transaction clients, by a digest of their settings: Spark runs a
#: query's commits in one Python worker it keeps, so a batch's commit finds the
#: connections of the last one's (a kafka-python client reconnects by itself).
_KEPT: Kept[TransactionClient] = Kept(TransactionClient.close, size=8)


def kept_client(config: KafkaConfig) -> AbstractContextManager[TransactionClient]:
    """Driver: the process's transaction client for ``config``, made on first use; one that
    failed a call is closed and made again next time."""
    return _KEPT.lent(settings_digest(config), lambda: TransactionClient(config))


def check_batch_commit(
    config: KafkaConfig, transactional_id: str, timeout_s: float = COORDINATOR_WAIT_S
) -> None:
    """Driver, at start: the driver reaches the transaction coordinators and may describe
    the sink's transactional ids and the offsets topic (:meth:`TransactionClient.rebegun`
    needs it); else the query fails naming the fallback mode. Never
    falls back on its own. A refusal fails at once; a coordinator that cannot be reached
    or is loading is asked again for ``timeout_s``."""
    import kafka.errors as errors

    try:
        client = TransactionClient(config, timeout_s=timeout_s)
    except errors.KafkaError as exc:
        raise TransactionEndError(
            f"The driver cannot reach the Kafka cluster at {bootstrap(config)} for the batch "
            f"commit ({type(exc).__name__}); let it reach the brokers or use {FALLBACK_HINT}."
        ) from None
    try:
        _check_describes(client, transactional_id, timeout_s)
        if not client.sees_offsets_topic():
            raise offsets_topic_hidden(client.where)
    finally:
        client.close()


def _check_describes(client: TransactionClient, transactional_id: str, timeout_s: float) -> None:
    """Start check: the driver may describe ``transactional_id`` at its coordinator."""
    import kafka.errors as errors

    try:
        describe_when_ready(client, transactional_id, time.monotonic() + timeout_s)
    except errors.TransactionalIdNotFoundError:
        pass  # a sink's first start: the id was never used
    except errors.KafkaError as exc:
        if exc.retriable:
            raise TransactionEndError(
                f"The driver found no transaction coordinator of transactional id "
                f"{transactional_id!r} that answers on {client.where} within {timeout_s:g} s "
                f"({type(exc).__name__}); let it reach every broker or use {FALLBACK_HINT}."
            ) from None
        raise TransactionEndError(
            f"The driver cannot describe transactional id {transactional_id!r} on "
            f"{client.where} ({type(exc).__name__}): the batch commit needs DESCRIBE and WRITE "
            f"on the sink's transactional ids; grant them or use {FALLBACK_HINT}."
        ) from None


def offsets_topic_hidden(where: str) -> TransactionEndError:
    """The refusal when the driver may not describe the offsets topic (checked at start,
    and again before a transaction is taken for begun again: ACLs change)."""
    return TransactionEndError(
        f"The driver may not describe topic {OFFSETS_TOPIC} on {where}: the batch commit "
        "tells a transaction that another client ended (and its task began again) by the "
        "offsets partition it lacks, and Kafka shows a transaction's partitions only to a "
        f"principal that may describe their topics. Grant DESCRIBE on topic {OFFSETS_TOPIC} "
        f"(nothing there is read) or use {FALLBACK_HINT}. Nothing was committed or aborted."
    )


def describe_when_ready(client: TransactionClient, transactional_id: str, deadline: float) -> Any:
    """Describe ``transactional_id`` (its description): :func:`described_when_ready`."""
    return described_when_ready(client, [transactional_id], deadline).get(transactional_id)


def described_when_ready(
    client: TransactionClient, transactional_ids: Sequence[str], deadline: float
) -> dict[str, Any]:
    """Describe ``transactional_ids`` (by id), asking again while a coordinator answers
    that it is not ready (a broker that has just started loads the transaction log
    first: COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS), has moved
    (NOT_COORDINATOR) or cannot be reached (its broker died and it has not moved yet),
    until ``deadline``."""
    import kafka.errors as errors

    delay = 0.1
    while True:
        try:
            return client.describe(transactional_ids)
        except errors.KafkaError as exc:
            if not exc.retriable or time.monotonic() + delay > deadline:
                raise
            log.info("transaction coordinator not ready (%s); asking again", type(exc).__name__)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


_ENDS = {True: "commit", False: "abort"}


def _end_txn(commit: bool, txn: OpenTransaction) -> Any:
    from kafka.protocol.producer.transaction import EndTxnRequest

    return EndTxnRequest(
        transactional_id=txn.transactional_id,
        producer_id=txn.producer_id,
        producer_epoch=txn.epoch,
        committed=commit,
        max_version=END_TXN_VERSION,
    )


def _init_producer_id(timeout_ms: int, txn: OpenTransaction) -> Any:
    from kafka.protocol.producer.transaction import InitProducerIdRequest

    return InitProducerIdRequest(
        transactional_id=txn.transactional_id,
        transaction_timeout_ms=timeout_ms,
        producer_id=-1,
        producer_epoch=-1,
    )


def _refused(txn: OpenTransaction, error: str, doing: str) -> TransactionEndError:
    kind: type[TransactionEndError] = TransactionEndError
    if error in FENCED:
        kind = TransactionFencedError
    elif error in ENDED_OTHERWISE:
        kind = TransactionEndedError
    refused = kind(
        f"The coordinator refused to {doing} transaction {txn.transactional_id!r} "
        f"(producer {txn.producer_id}, epoch {txn.epoch}): {error}."
    )
    refused.code = error
    return refused


#: The internal topic of consumer groups' offsets: a transaction's marker offset is there.
OFFSETS_TOPIC = "__consumer_offsets"


def _rebegun(txn: OpenTransaction, described: Any) -> bool:
    """Whether ``described`` (a DescribeTransactions answer) is ``txn``'s id and epoch
    ongoing without an offsets partition: begun again after another client ended it."""
    return (
        str(getattr(described.state, "value", described.state)) == "Ongoing"
        and (described.producer_id, described.producer_epoch) == (txn.producer_id, txn.epoch)
        and all(tp.topic != OFFSETS_TOPIC for tp in described.topic_partitions)
    )


def _task(rest: str, slot: int | None) -> bool:
    """Whether an id's tail after a sink's prefix names a task partition: a number, then
    ``r`` and a run's slot or not (only ``slot``'s when given), then ``a`` and an attempt
    slot or not (``3``, ``3a7``, ``3r5``, ``3r5a7``: :func:`.options.transactional_id`)."""
    named = _TASK_TAIL.match(rest)
    if named is None:
        return False
    return slot is None or named.group("run") == str(slot)


_TASK_TAIL = re.compile(r"[0-9]+(?:r(?P<run>[0-9]+))?(?:a[0-9]+)?\Z")
