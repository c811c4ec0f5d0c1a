"""Which broker coordinates a transactional id, as Kafka computes it (the harness kills that
broker at a protocol step). Cost: under 0.1 s."""

from __future__ import annotations

from eos_connectors.dev.stack.kafka_cluster import java_hash


def test_kafkas_rule_for_a_transactional_ids_coordinator() -> None:
    """Java's String.hashCode, made non-negative as Kafka's Utils.abs does."""
    assert java_hash("hello") == 99162322
    assert java_hash("polygenelubricants") == 0  # hashCode is Integer.MIN_VALUE
    assert java_hash("eos-sink-0") == 1803411642  # as java.lang.String says
