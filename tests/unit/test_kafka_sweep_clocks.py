"""Which open transactions a sweep of the Kafka batch commit takes, on a broker before
Kafka 3.8 (no ListTransactions duration filter: kafka-python refuses it before asking):
those their coordinator saw begin before the driver's call by the driver's wall clock.
The brokers' own answer on 3.8+ is tests/services/test_kafka_txn_coordinator.py's.
Cost: under 0.1 s (no server: the admin client's answers are scripted)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import kafka.errors as errors

from eos_connectors.sinks.kafka.coordinator import CallTime, OpenTransaction, TransactionClient


class _OldBroker:
    """kafka-python's admin client against a broker without KIP-994."""

    def __init__(self, started: dict[str, int]) -> None:
        self.started = started
        self.asked_durations: list[int | None] = []

    def list_transactions(self, state_filters: list[str], duration_filter_ms: Any) -> Any:
        self.asked_durations.append(duration_filter_ms)
        if duration_filter_ms is not None:
            raise errors.UnsupportedVersionError("duration_filter_ms requires Kafka 3.8+")
        return {1: [SimpleNamespace(transactional_id=i) for i in self.started]}

    def describe_transactions(self, ids: list[str]) -> dict[str, Any]:
        return {
            i: SimpleNamespace(
                state="Ongoing", producer_id=7, producer_epoch=3, transaction_start_time_ms=t
            )
            for i, t in self.started.items()
            if i in ids
        }


def test_before_kafka_3_8_a_sweep_compares_start_times_with_the_drivers_clock() -> None:
    client = TransactionClient.__new__(TransactionClient)  # no connection: scripted admin
    admin = _OldBroker({"eos-s-0": 1_000, "eos-s-1": 5_000, "eos-other-0": 1_000})
    client.admin = admin
    call = CallTime(wall_ms=3_000, monotonic_s=0.0)
    assert client.open_transactions("eos-s-", began_before=call) == [
        OpenTransaction("eos-s-0", 7, 3)
    ]
    assert admin.asked_durations[0] is not None, "the brokers were not asked first"
    assert admin.asked_durations[-1] is None
    everything = client.open_transactions("eos-s-")
    assert [t.transactional_id for t in everything] == ["eos-s-0", "eos-s-1"]
