"""The benchmark's CPU clock finds the local broker and sees what transactions cost it."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Producer

from connectors.compare.process import CpuClock, local_broker
from connectors.endpoints import Endpoints
from connectors.topics import create_topic

pytestmark = pytest.mark.services


def test_the_clock_charges_the_local_broker_for_transactions(
    endpoints: Endpoints, unique: str
) -> None:
    broker = local_broker(endpoints.kafka_bootstrap)
    assert broker is not None and "kafka.Kafka" in broker.cmdline()
    assert local_broker("192.0.2.1:9092") is None  # not on this machine: not looked for
    topic = f"cpu-{unique}"
    create_topic(endpoints.kafka_bootstrap, topic)
    producer = Producer({"bootstrap.servers": endpoints.kafka_bootstrap,
                         "transactional.id": f"cpu-{unique}"})  # fmt: skip
    producer.init_transactions(30)
    clock = CpuClock(broker)
    clock.sample([])
    began = time.time()
    for i in range(40):
        producer.begin_transaction()
        producer.produce(topic, str(i).encode())
        producer.commit_transaction(30)
    ended = time.time()
    time.sleep(0.02)
    clock.sample([])
    used = clock.between(began, ended)
    assert used is not None
    pipeline, broker_s = used
    assert pipeline == 0.0  # an empty tree
    assert broker_s is not None and broker_s > 0.01  # ~40 transactions' coordinator work
