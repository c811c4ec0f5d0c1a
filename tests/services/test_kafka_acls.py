"""The Kafka sink's batch commit as a principal holding only the ACLs docs/deploy.md lists
(the stack's broker checks ACLs), driven without Spark.

Cost: ~2 s.
"""

from __future__ import annotations

import pytest

from eos_connectors.dev.endpoints import Endpoints, KafkaSasl
from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter
from eos_connectors.sinks.kafka.coordinator import (
    OFFSETS_TOPIC,
    TransactionClient,
    TransactionEndError,
    check_batch_commit,
)
from eos_connectors.sinks.kafka.decisions import Decision, write_decision
from eos_connectors.sinks.kafka.options import KafkaSinkOptions
from eos_connectors.sinks.kafka.options import parse_options as sink_options
from tests.kafka_acl_util import DESCRIBE, TOPIC, Grant, Principal, sink_grants
from tests.kafka_sink_util import a_task, read_written, rows_of

pytestmark = pytest.mark.services


def test_a_driver_that_cannot_see_the_offsets_topic_aborts_no_decided_transaction(
    endpoints: Endpoints, sasl: KafkaSasl, batch_commit_options: KafkaSinkOptions
) -> None:
    """A coordinator lists only the partitions of a transaction that the asker may
    describe. A driver without DESCRIBE on ``__consumer_offsets`` saw every transaction of
    a batch without its marker's offsets partition, took each for one another client had
    aborted and its task begun again, and aborted the whole decided batch: every batch
    failed, and its replay again. Now the start check refuses such a principal, naming
    the ACL and the fallback mode, and the commit, if the ACL goes while the query runs,
    fails without aborting anything; with the ACL, the same principal commits the batch."""
    options = batch_commit_options
    assert options.topic is not None and options.sink_id is not None
    sees = Grant(TOPIC, OFFSETS_TOPIC, DESCRIBE)
    grants = sink_grants(options.sink_id, options.topic, options.marker_log)
    principal = Principal(endpoints, sasl, [g for g in grants if g != sees])
    limited = sink_options(
        {"topic": options.topic, "sinkId": options.sink_id, **principal.sasl.options()}
    )
    writer = BatchCommitWriter(options)  # the tasks: the stack's own user
    prepared = [writer.write_task(a_task(0, partition=p), iter(rows_of(0))) for p in range(2)]
    txns = {r.partition: r.txn for r in prepared if r.txn is not None}
    hidden = rf"DESCRIBE on topic {OFFSETS_TOPIC}.*commitMode=task"
    with pytest.raises(TransactionEndError, match=hidden):
        check_batch_commit(limited.kafka, txns[0].transactional_id)
    client = TransactionClient(limited.kafka)
    try:
        with pytest.raises(TransactionEndError, match=hidden):
            client.rebegun(list(txns.values()))
        principal.grant([sees])
        check_batch_commit(limited.kafka, txns[0].transactional_id)
        assert client.rebegun(list(txns.values())) == [], "both as their tasks left them"
    finally:
        client.close()
    write_decision(limited, options.sink_id, Decision(0, prepared[0].query_id, txns, 0))
    BatchCommitWriter(limited).commit(list(prepared), 0)
    written = read_written(endpoints.kafka, options.topic)
    assert len(written) == 2 * rows_of(0)[0].num_rows, "the batch, committed once"
