"""Task: the producer id and epoch of the transaction a task's producer holds open, for
the driver to end (:mod:`.coordinator`).

librdkafka does not return them from any call; its statistics do (the ``eos`` block:
``txn_state``, ``producer_id``, ``producer_epoch``). A producer made with
:meth:`Identity.settings` emits statistics every :data:`INTERVAL_MS`; :class:`Identity` keeps the
last ``eos`` block, and :meth:`Identity.wait` polls the producer until one shows the
transaction open with an id assigned. The task reads them from its own client: the
driver never asks the coordinator whose epoch an id has now, since a zombie that
initialised the id since would answer with its own.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from eos_connectors.core.errors import EosError
from eos_connectors.sinks.kafka.coordinator import OpenTransaction

INTERVAL_MS = 10
#: librdkafka's transaction states in which the transaction holds records to end.
OPEN_STATES = frozenset({"InTransaction", "BeginCommit", "BeginAbort"})


class IdentityError(EosError):
    """The producer never showed an open transaction with its id and epoch."""


class Identity:
    """The ``stats_cb`` of a transactional producer: its last ``eos`` statistics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._eos: dict[str, Any] = {}

    def __call__(self, stats: str) -> None:
        eos = json.loads(stats).get("eos")
        if isinstance(eos, dict):
            with self._lock:
                self._eos = eos

    def settings(self) -> dict[str, Any]:
        """What a producer needs to report to this."""
        return {"statistics.interval.ms": INTERVAL_MS, "stats_cb": self}

    def wait(self, producer: Any, transactional_id: str, timeout_s: float) -> OpenTransaction:
        """The open transaction of ``producer`` (after its records were flushed), once
        its statistics show it."""
        return self._showing(producer, transactional_id, OPEN_STATES, timeout_s)

    def ready(self, producer: Any, transactional_id: str, timeout_s: float) -> OpenTransaction:
        """The producer id and epoch ``producer``'s ``init_transactions()`` was given (no
        transaction open yet), once its statistics show them."""
        return self._showing(producer, transactional_id, frozenset({"Ready"}), timeout_s)

    def _showing(
        self, producer: Any, transactional_id: str, states: frozenset[str], timeout_s: float
    ) -> OpenTransaction:
        deadline = time.monotonic() + timeout_s
        while True:  # statistics the flush delivered count: no poll before the first look
            with self._lock:
                eos = dict(self._eos)
            if eos.get("txn_state") in states and int(eos.get("producer_id", -1)) >= 0:
                return OpenTransaction(
                    transactional_id, int(eos["producer_id"]), int(eos["producer_epoch"])
                )
            if time.monotonic() > deadline:
                raise IdentityError(
                    f"Transactional id {transactional_id!r}: the producer's statistics showed "
                    f"no {'/'.join(sorted(states))} transaction state with its id within "
                    f"{timeout_s:.0f} s (last: {eos or 'none'})."
                )
            producer.poll(INTERVAL_MS / 1000)
