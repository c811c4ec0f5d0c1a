"""The source's driver against its broker cut off for a few seconds, through a real TCP
proxy in front of the stack's proxied listener (the harness's `kafka:cut`).

Cost: ~5 s (a 4 s cut waited out)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness.network import FAULT_SECONDS, NetworkFaults
from eos_connectors.sources.kafka.broker import BrokerView
from eos_connectors.sources.kafka.options import parse_options
from tests.kafka_util import produce_plain

pytestmark = pytest.mark.services


@pytest.mark.cost(5)
def test_latest_offsets_asked_while_the_broker_is_cut_off_wait_for_it(
    endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """Spark asks a query's source for the latest offsets every batch, through an admin
    client the source keeps between batches. Once that client has seen its broker go,
    librdkafka's ListOffsets fails at once, before asking anyone (`_NOENT`, "No leaders
    found"): a query failed so, "in 0 s", in the middle of a 4 s Kafka cut. The source
    asks again with a new client, which waits until the broker answers."""
    if not endpoints.kafka_proxied:
        pytest.skip("this broker has no proxied listener (restart the stack's Kafka)")
    topic = f"src-cut-{unique}"
    create_topic(endpoints.kafka, topic, 2)
    produce_plain(endpoints.kafka_bootstrap, topic, [b"a", b"b", b"c"], partition=1)
    network, piped = NetworkFaults.start(tmp_path / "toxiproxy", endpoints, ("kafka",))
    cut = threading.Thread()
    try:
        options = {"kafka.bootstrap.servers": piped.kafka_bootstrap, "subscribe": topic}
        view = BrokerView(parse_options(options))
        tps = [(topic, 0), (topic, 1)]
        expected = {(topic, 0): 0, (topic, 1): 3}
        assert view.latest(tps) == expected
        cut = threading.Thread(target=network.inject, args=("kafka", "cut"))
        cut.start()
        time.sleep(0.5)  # the client's connection closed: it knows the broker is down
        began = time.monotonic()
        assert view.latest(tps) == expected
        waited = time.monotonic() - began
        cut.join()
        assert waited > FAULT_SECONDS - 1.5, f"answered in {waited:.1f} s during the cut"
    finally:
        if cut.is_alive():
            cut.join()  # the proxy back before it stops
        network.stop()
