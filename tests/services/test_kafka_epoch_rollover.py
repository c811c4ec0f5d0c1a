"""The batch commit through a producer epoch's roll-over, and its ids reused by a restart
(issue 53; the two places where Flink's committer still breaks, FLINK-40689 and
FLINK-40626). Each batch initialises its task partitions' transactional ids again, so an
id's epoch grows by one a batch: at one batch a second it reaches the protocol's maximum
(32,767) in about nine hours, and the coordinator then gives the id a new producer id at
epoch 0. The driver commits what each task reports it opened (read from the task's own
client), so nothing of it may assume one producer id per transactional id.

A task attempt writes under its task partition's id with the attempt's slot (Spark's task
attempt id modulo ATTEMPT_SLOTS); here every batch's tasks take the same slots, the worst
case (a query whose batches use a multiple of ATTEMPT_SLOTS task attempts each), so one id
is initialised every batch. The test brings partition 0's id to the edge with
InitProducerId requests of its own (kafka-python, one after another: ~32,000 of them),
then runs batches through the roll-over, then runs the next batch with a new writer (a
restarted query: the same ids). Every batch must be visible once, and the roll-over must
have happened.

Cost: ~25 s here (~32,000 InitProducerId requests, ~20 s): `make soak`, not CI.
"""

from __future__ import annotations

import pyarrow as pa
import pytest

from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter, PreparedTask
from eos_connectors.sinks.kafka.checks import check_broker
from eos_connectors.sinks.kafka.coordinator import TransactionClient
from eos_connectors.sinks.kafka.options import ATTEMPT_SLOTS, parse_options
from tests.kafka_sink_util import a_task

pytestmark = [pytest.mark.services, pytest.mark.soak]

#: The highest epoch a producer id reaches before the coordinator rotates it.
MAX_EPOCH = 32_767
TASKS = 2


def _init_until(client: TransactionClient, txn_id: str, epoch: int) -> tuple[int, int]:
    """InitProducerId on ``txn_id`` until its epoch is ``epoch``; its (producer id, epoch)."""
    from kafka.protocol.metadata import CoordinatorType
    from kafka.protocol.producer.transaction import InitProducerIdRequest

    admin = client.admin

    async def run() -> tuple[int, int]:
        node = await admin._find_coordinator_id(txn_id, key_type=CoordinatorType.TRANSACTION)
        got = (-1, -1)
        while got[1] < epoch:
            request = InitProducerIdRequest(
                transactional_id=txn_id, transaction_timeout_ms=60_000, max_version=2
            )
            response = await admin._manager.send(request, node_id=node)
            assert response.error_code == 0, response
            got = (response.producer_id, response.producer_epoch)
        return got

    result: tuple[int, int] = admin._manager.run(run)
    return result


def _rows(batch: int, partition: int) -> list[pa.RecordBatch]:
    values = [f"b{batch}-p{partition}-r{i}".encode() for i in range(20)]
    return [pa.RecordBatch.from_arrays([pa.array(values), pa.array(values)], ["key", "value"])]


def _batch(writer: BatchCommitWriter, batch: int, run: str) -> list[PreparedTask]:
    # Task partition p takes attempt slot p every batch.
    tasks = [a_task(batch, run, p, attempt=(batch + 1) * ATTEMPT_SLOTS + p) for p in range(TASKS)]
    reports = [writer.write_task(task, iter(_rows(batch, task.partition))) for task in tasks]
    writer.commit(list(reports), batch)
    return reports


def test_batches_commit_once_through_an_epoch_roll_over_and_a_restart(
    endpoints: Endpoints, unique: str
) -> None:
    topic, sink = f"kroll-{unique}", f"kroll-{unique}"
    create_topic(endpoints.kafka, topic, 2)
    raw = {
        "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
        "topic": topic,
        "sinkId": sink,
        "commitMode": "batch",
    }
    options = parse_options(raw)
    check_broker(options)
    writer = BatchCommitWriter(options)
    first = _batch(writer, 0, "run-1")[0].txn
    assert first is not None

    client = TransactionClient(options.kafka)
    try:
        edge = _init_until(client, first.transactional_id, MAX_EPOCH - 3)
    finally:
        client.close()
    assert edge[0] == first.producer_id, "rotated before the edge"

    seen = [t.txn for b in range(1, 6) for t in _batch(writer, b, "run-1") if t.partition == 0]
    assert {t.transactional_id for t in seen if t is not None} == {first.transactional_id}
    rotated = [t for t in seen if t is not None and t.producer_id != first.producer_id]
    assert rotated and rotated[-1].epoch < 5, f"no roll-over: {seen}"

    restarted = BatchCommitWriter(parse_options(raw))  # a restarted query: the same ids
    _batch(restarted, 6, "run-2")

    written = sorted(r.value for r in read_to_end(endpoints.kafka, topic))
    expected = sorted(
        v for b in range(7) for p in range(TASKS) for v in _rows(b, p)[0].column(1).to_pylist()
    )
    assert written == expected, "a batch lost or written twice across the roll-over"
