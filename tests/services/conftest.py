"""Fixtures of the tests against the real services without Spark."""

from __future__ import annotations

import pytest

from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.kafka.exactly_once import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.options import KafkaSinkOptions
from tests.kafka_sink_util import new_sink_options


@pytest.fixture
def writer(endpoints: Endpoints, unique: str) -> KafkaExactlyOnceWriter:
    return KafkaExactlyOnceWriter(new_sink_options(endpoints, "ks", unique))


@pytest.fixture
def batch_commit_options(endpoints: Endpoints, unique: str) -> KafkaSinkOptions:
    """A Kafka sink in ``commitMode=batch`` on a new two-partition topic, its marker log
    made as the driver's start check makes it."""
    return new_sink_options(endpoints, "kb", unique, commitMode="batch")
