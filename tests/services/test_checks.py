"""The harness's own checks, shown to fail: each reads a real service, and a check that
cannot see a loss, a duplicate or a leftover proves nothing."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from eos_connectors.core.topics import create_topic, end_offsets
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness import checks


@pytest.mark.cost(7)
def test_the_kafka_check_takes_each_words_last_count_so_a_count_that_goes_back_is_lost(
    endpoints: Endpoints, unique: str
) -> None:
    """A running count's records of one word are read in offset order and the last one
    counts: a count that went 5, then 3 holds 3 (it used to take the largest, 5)."""
    topic = f"checks-{unique}"
    create_topic(endpoints.kafka, topic)
    producer = Producer({"bootstrap.servers": endpoints.kafka_bootstrap})
    for word, count in (("w1", 2), ("w1", 5), ("w2", 4), ("w1", 3)):
        producer.produce(topic, str(count).encode(), word.encode(), partition=0)
    assert producer.flush(30) == 0
    observed = checks.kafka_counts(endpoints.kafka_bootstrap, topic, timeout=5)
    assert observed.counts == {"w1": 3, "w2": 4}
    result = checks.compare("kafka", {"w1": 5, "w2": 4}, observed)
    assert (result.lost, result.duplicated, result.wrong, result.ok) == (2, 0, 0, False)


@pytest.mark.cost(4)
def test_open_transactions_finds_a_really_open_transaction(
    endpoints: Endpoints, unique: str
) -> None:
    """A transaction left open on a partition holds its last stable offset back: the check
    names that partition, and none once the transaction is aborted."""
    topic = f"checks-open-{unique}"
    create_topic(endpoints.kafka, topic, 2)
    producer = Producer(
        {"bootstrap.servers": endpoints.kafka_bootstrap, "transactional.id": f"open-{unique}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"held", b"k", partition=1)
    assert producer.flush(30) == 0
    assert checks.open_transactions(endpoints.kafka_bootstrap, topic, timeout=3) == {1}
    producer.abort_transaction(30)
    ends = end_offsets(endpoints.kafka, topic)
    assert checks.open_transactions(endpoints.kafka_bootstrap, topic, timeout=10) == set()
    assert end_offsets(endpoints.kafka, topic) == ends, "the check wrote into the topic"
