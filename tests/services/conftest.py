"""Fixtures of the tests against the real services without Spark."""

from __future__ import annotations

import pytest

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.kafka.checks import check_broker
from eos_connectors.sinks.kafka.exactly_once import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.options import KafkaSinkOptions
from eos_connectors.sinks.kafka.options import parse_options as sink_options


@pytest.fixture
def writer(endpoints: Endpoints, unique: str) -> KafkaExactlyOnceWriter:
    topic = f"ks-{unique}"
    create_topic(endpoints.kafka, topic, 2)
    options = sink_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "topic": topic,
            "sinkId": f"ks-{unique}",
        }
    )
    check_broker(options)  # what the driver does at query start: creates the marker log
    return KafkaExactlyOnceWriter(options)


@pytest.fixture
def batch_commit_options(endpoints: Endpoints, unique: str) -> KafkaSinkOptions:
    """A Kafka sink in ``commitMode=batch`` on a new two-partition topic, its marker log
    made as the driver's start check makes it."""
    topic = f"kb-{unique}"
    create_topic(endpoints.kafka, topic, 2)
    options = sink_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "topic": topic,
            "sinkId": f"kb-{unique}",
            "commitMode": "batch",
        }
    )
    check_broker(options)
    return options
