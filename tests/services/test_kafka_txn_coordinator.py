"""The driver ends transactions that tasks left open (issue 53's mechanism), on the real
broker: nothing of a transaction is visible to read_committed readers before the
driver's commit, all of it right after; a repeated commit is harmless, an abort after
it refused; an id initialised again since (a zombie) fences the old transaction and
the driver is told; a transaction whose producer's process exited is still committed; a
producer kept across batches would let a late commit through (why tasks take new ones);
a sweep tells what began before its call by the brokers' clocks.

Cost: ~8 s (one short Python process)."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.kafka.coordinator import (
    CallTime,
    OpenTransaction,
    TransactionClient,
    TransactionEndError,
    TransactionFencedError,
)
from eos_connectors.sinks.kafka.txn_identity import Identity
from tests.kafka_sink_util import wait_for_markers

pytestmark = pytest.mark.services


def _open_transaction(
    endpoints: Endpoints, topic: str, txn_id: str, records: int, tag: str
) -> tuple[Producer, OpenTransaction]:
    """What a task does under the batch commit: write, flush, return the identity."""
    identity = Identity()
    producer = Producer({**endpoints.kafka, "transactional.id": txn_id, **identity.settings()})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(records):
        producer.produce(topic, key=f"k{i}".encode(), value=f"{tag}-{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0
    return producer, identity.wait(producer, txn_id, 10)


@pytest.fixture
def client(endpoints: Endpoints) -> Iterator[TransactionClient]:
    made = TransactionClient(endpoints.kafka, timeout_s=20)
    yield made
    made.close()


def test_records_appear_only_when_the_driver_commits_and_all_at_once(
    endpoints: Endpoints, client: TransactionClient, unique: str
) -> None:
    topic = f"txn-end-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    _a, first = _open_transaction(endpoints, topic, f"{topic}-0", 600, "a")
    _b, second = _open_transaction(endpoints, topic, f"{topic}-1", 400, "b")
    assert read_to_end(endpoints.kafka, topic) == [], "an open transaction was visible"
    described = client.describe([first.transactional_id])[first.transactional_id]
    assert (described.producer_id, described.producer_epoch) == (first.producer_id, first.epoch)

    began = time.monotonic()
    client.end([first, second], commit=True)
    took = time.monotonic() - began
    wait_for_markers(endpoints.kafka, topic)
    values = sorted(r.value for r in read_to_end(endpoints.kafka, topic, timeout=10))
    assert len(values) == 1_000 and len(set(values)) == 1_000
    assert took < 1.0, f"two EndTxn took {took:.2f} s"

    client.end([first, second], commit=True)  # a repeat (a driver's retry) changes nothing
    with pytest.raises(TransactionEndError) as refused:
        client.end([first], commit=False)
    assert refused.value.code == "INVALID_TXN_STATE"
    wait_for_markers(endpoints.kafka, topic)
    assert len(read_to_end(endpoints.kafka, topic, timeout=10)) == 1_000


def test_an_id_initialised_again_fences_the_open_transaction_and_the_driver_is_told(
    endpoints: Endpoints, client: TransactionClient, unique: str
) -> None:
    topic = f"txn-fenced-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    _old, opened = _open_transaction(endpoints, topic, f"{topic}-0", 100, "old")
    zombie = Producer({**endpoints.kafka, "transactional.id": opened.transactional_id})
    zombie.init_transactions(30)  # aborts the open transaction, bumps the epoch
    with pytest.raises(TransactionFencedError) as fenced:
        client.end([opened], commit=True)
    assert fenced.value.code in ("INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED")
    wait_for_markers(endpoints.kafka, topic)
    assert read_to_end(endpoints.kafka, topic, timeout=10) == [], "a fenced txn was committed"


def test_a_producer_kept_across_batches_would_let_a_late_commit_through(
    endpoints: Endpoints, client: TransactionClient, unique: str
) -> None:
    """Why each batch's task takes a new producer: the epoch is the only thing that tells
    one of an id's transactions from the next (librdkafka speaks transaction version 1).
    A producer whose transaction the driver committed can commit it again itself and
    begin the next one, but librdkafka allows no second ``init_transactions`` and its
    abort moves no epoch: the next transaction has the same producer id and epoch, and a
    late ``EndTxn(commit)`` meant for the first (from a driver paused since, say)
    commits the second before any decision. With a new
    producer, ``InitProducerId`` moves the epoch and the late commit is fenced."""
    from confluent_kafka import KafkaException

    topic = f"txn-kept-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    kept, first = _open_transaction(endpoints, topic, f"{topic}-0", 10, "first")
    client.end([first], commit=True)  # the driver's commit of batch b
    kept.commit_transaction(30)  # the producer's own, a repeat: no error
    with pytest.raises(KafkaException, match="state"):
        kept.init_transactions(30)  # no new epoch for a kept producer
    kept.begin_transaction()
    kept.produce(topic, value=b"second", partition=0)
    assert kept.flush(30) == 0
    client.end([first], commit=True)  # late: batch b's identity, batch b+1 undecided
    wait_for_markers(endpoints.kafka, topic)
    values = {r.value for r in read_to_end(endpoints.kafka, topic, timeout=10)}
    assert b"second" in values, "the late commit no longer commits the next transaction"

    _new, next_one = _open_transaction(endpoints, topic, f"{topic}-0", 1, "third")
    assert next_one.epoch > first.epoch
    with pytest.raises(TransactionFencedError):
        client.end([first], commit=True)  # a new producer's epoch fences the late commit
    client.end([next_one], commit=False)
    wait_for_markers(endpoints.kafka, topic)
    values = {r.value for r in read_to_end(endpoints.kafka, topic, timeout=10)}
    assert b"third-0" not in values, "a late commit committed a new producer's transaction"


def test_a_sweep_tells_what_began_before_its_call_by_the_brokers_clocks(
    endpoints: Endpoints, client: TransactionClient, unique: str
) -> None:
    """The batch commit's sweeps end only transactions begun before the driver's call.
    On Kafka 3.8+ the brokers tell (how long a transaction has run on their clocks,
    against how long the call has), so a driver clock an hour off either way changes
    nothing: a transaction begun before the call is swept, one begun after it is not."""
    topic = f"txn-sweep-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    _a, before = _open_transaction(endpoints, topic, f"{topic}-0", 10, "before")
    time.sleep(0.1)
    now_ms = int(time.time() * 1000)
    behind = CallTime(now_ms - 3_600_000, time.monotonic())  # the driver's clock an hour slow
    ahead = CallTime(now_ms + 3_600_000, time.monotonic())  # an hour fast
    time.sleep(0.1)
    _b, after = _open_transaction(endpoints, topic, f"{topic}-1", 10, "after")
    prefix = f"{topic}-"
    assert client.open_transactions(prefix, began_before=ahead) == [before]
    assert client.sweep(prefix, [], began_before=behind) == [before]
    assert client.open_transactions(prefix) == [after], "the swept one is still open"
    client.end([after], commit=False)


TASK = """
import json, sys
from confluent_kafka import Producer
from eos_connectors.sinks.kafka.txn_identity import Identity
bootstrap, topic, txn_id = sys.argv[1:]
identity = Identity()
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id,
                     **identity.settings()})
producer.init_transactions(30)
producer.begin_transaction()
for i in range(500):
    producer.produce(topic, value=b"%d" % i, partition=i % 2)
assert producer.flush(30) == 0
txn = identity.wait(producer, txn_id, 10)
print(json.dumps([txn.producer_id, txn.epoch]), flush=True)
"""


def test_a_transaction_whose_task_process_exited_is_committed_by_the_driver(
    endpoints: Endpoints, client: TransactionClient, unique: str
) -> None:
    """librdkafka neither commits nor aborts when its process ends: the task may exit."""
    topic = f"txn-exited-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    txn_id = f"{topic}-0"
    done = subprocess.run(
        [sys.executable, "-c", TASK, endpoints.kafka_bootstrap, topic, txn_id],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    producer_id, epoch = json.loads(done.stdout.strip().splitlines()[-1])
    assert read_to_end(endpoints.kafka, topic) == []
    client.end([OpenTransaction(txn_id, producer_id, epoch)], commit=True)
    wait_for_markers(endpoints.kafka, topic)
    assert len(read_to_end(endpoints.kafka, topic, timeout=10)) == 500


def test_the_driver_client_logs_no_password_at_debug(
    endpoints: Endpoints, caplog: pytest.LogCaptureFixture
) -> None:
    """kafka-python logs an admin client's whole configuration at DEBUG."""
    secret = "s3cret-never-logged"
    settings = {**endpoints.kafka, "sasl.username": "u", "sasl.password": secret}
    with caplog.at_level(logging.DEBUG):
        TransactionClient(settings, timeout_s=10).close()
    assert caplog.records, "nothing was logged at DEBUG: the check proves nothing"
    assert secret not in caplog.text
