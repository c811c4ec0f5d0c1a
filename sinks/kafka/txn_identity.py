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


_DECODER = json.JSONDecoder()
_EOS_KEY = '"eos":'


def eos_block(stats: str) -> dict[str, Any] | None:
    """The ``eos`` object of librdkafka's statistics ``stats``, decoded alone.

    The statistics describe every broker, topic and partition; only the top-level
    ``eos`` object is read here, so it is found by its key and decoded on its own: a
    task's producer emits statistics every 10 ms, and decoding the whole document each
    time was ~2.4 ms of a ~100 ms task. The key cannot occur inside a JSON string (its
    quotes would be escaped there); a topic called ``eos`` is a key of ``topics``,
    which librdkafka writes before the top-level ``eos``, so the last one is taken. An
    object without ``txn_state``, or a document without the key, is decoded whole."""
    at = stats.rfind(_EOS_KEY)
    if at >= 0:
        value = at + len(_EOS_KEY)
        while stats[value : value + 1].isspace():  # librdkafka writes '"eos": {'
            value += 1
        try:
            block, _ = _DECODER.raw_decode(stats, value)
        except ValueError:
            block = None
        if isinstance(block, dict) and "txn_state" in block:
            return block
    eos = json.loads(stats).get("eos")
    return eos if isinstance(eos, dict) else None


class IdentityError(EosError):
    """The producer never showed an open transaction with its id and epoch."""


class Identity:
    """The ``stats_cb`` of a transactional producer: its last ``eos`` statistics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._eos: dict[str, Any] = {}

    def __call__(self, stats: str) -> None:
        eos = eos_block(stats)
        if eos is not None:
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
