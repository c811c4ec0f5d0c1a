"""The producer's ``eos`` statistics, read without decoding the whole document."""

from __future__ import annotations

import json
import time

from confluent_kafka import Producer

from eos_connectors.sinks.kafka.txn_identity import eos_block

EOS = {"txn_state": "InTransaction", "producer_id": 7, "producer_epoch": 3}
TOPIC_CALLED_EOS = {"topic": "eos", "partitions": {"0": {"txmsgs": 1}}}


def _librdkafka_statistics() -> str:
    """A real statistics document of a transactional producer (no broker needed)."""
    documents: list[str] = []
    producer = Producer(
        {
            "bootstrap.servers": "127.0.0.1:9",
            "transactional.id": "eos-block-test",
            "statistics.interval.ms": 10,
            "stats_cb": documents.append,
            "log_level": 0,
        }
    )
    deadline = time.monotonic() + 10
    while not documents and time.monotonic() < deadline:
        producer.poll(0.01)
    assert documents, "librdkafka emitted no statistics within 10 s"
    return documents[0]


def test_the_block_read_alone_is_the_one_a_whole_decode_finds() -> None:
    stats = _librdkafka_statistics()
    assert eos_block(stats) == json.loads(stats)["eos"]


def test_a_topic_called_eos_is_not_taken_for_the_block_in_either_order() -> None:
    after = json.dumps({"topics": {"eos": TOPIC_CALLED_EOS}, "eos": EOS, "tx": 1})
    before = json.dumps({"eos": EOS, "topics": {"eos": TOPIC_CALLED_EOS}, "tx": 1})
    assert eos_block(after) == EOS
    assert eos_block(before) == EOS  # the topic's object has no txn_state: decoded whole


def test_statistics_without_the_block_have_none() -> None:
    assert eos_block(json.dumps({"topics": {}, "tx": 0})) is None
