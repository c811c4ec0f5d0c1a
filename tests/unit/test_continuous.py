"""Every sink's commit refuses Spark's continuous processing (eos_connectors.core.continuous).

Under ``trigger(continuous=...)`` Spark hands a Python sink none of the rows and its
driver's commit gets ``None`` for every task; a later micro-batch run of the checkpoint
starts from offsets without batch metadata. No service is reached (about 1 s).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.continuous import ContinuousProcessingError, written_by_continuous
from eos_connectors.sinks.kafka import KafkaAtLeastOnceWriter, KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter
from eos_connectors.sinks.kafka.options import parse_options as kafka_options
from eos_connectors.sinks.postgres.at_least_once import PostgresAtLeastOnceWriter
from eos_connectors.sinks.postgres.options import parse_options as postgres_options
from eos_connectors.sinks.redis.at_least_once import RedisAtLeastOnceWriter
from eos_connectors.sinks.redis.layout import layout
from eos_connectors.sinks.redis.options import parse_options as redis_options
from eos_connectors.testing import MemorySink, rows_of

#: What Spark 4.0-4.3 write to ``offsets/N``: a micro-batch's metadata, or a continuous
#: run's empty line, then one line per source.
MICRO_BATCH = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n{"t":{"0":5}}'
CONTINUOUS = 'v1\n\n{"t":{"0":5}}'


def _writers(checkpoint: str | None) -> list[Any]:
    """One writer of each kind the formats make (none reaches a service when built)."""
    kafka = {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t"}
    postgres = postgres_options({"dsn": "postgresql://u@127.0.0.1:1/d", "table": "t"})
    redis = redis_options({"url": "redis://127.0.0.1:1/0", "keyColumn": "k", "valueColumns": "v"})
    schema = StructType([StructField("k", StringType()), StructField("v", LongType())])
    memory = MemorySink(f"unit-{uuid.uuid4().hex}", sink_id="s")
    memory.checkpoint_location = checkpoint
    return [
        BatchCommitWriter(kafka_options(kafka), checkpoint),
        KafkaExactlyOnceWriter(kafka_options({**kafka, "commitMode": "task"}), checkpoint),
        KafkaAtLeastOnceWriter(
            kafka_options({**kafka, "deliveryGuarantee": "at-least-once"}), checkpoint
        ),
        PostgresAtLeastOnceWriter(postgres, ("k", "v"), (), checkpoint),
        RedisAtLeastOnceWriter(redis, layout(redis, schema), checkpoint),
        memory,  # the protocol's commit, as PostgreSQL's and Redis's exactly-once writers run it
    ]


@pytest.mark.parametrize("index", range(6))
def test_every_sinks_commit_refuses_an_epoch_of_continuous_processing(index: int) -> None:
    writer = _writers(None)[index]
    with pytest.raises(ContinuousProcessingError) as refused:
        writer.commit([None, None], 7)
    text = str(refused.value)
    assert "trigger(continuous=...)" in text and "epoch 7" in text, text
    assert "trigger(processingTime=...)" in text and "new checkpoint" in text, text


@pytest.mark.parametrize("index", range(6))
def test_a_batch_whose_offsets_a_continuous_run_wrote_is_refused(
    index: int, tmp_path: Path
) -> None:
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "3").write_text(CONTINUOUS)
    writer = _writers(str(tmp_path))[index]
    with pytest.raises(ContinuousProcessingError, match="offsets/3 of checkpoint"):
        writer.commit([], 3)


def test_the_refusal_comes_before_the_decision(tmp_path: Path) -> None:
    """A micro-batch replay of a continuous run's last epoch is aborted by Spark after the
    refused commit: nothing of it may have been decided."""
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "4").write_text(CONTINUOUS)
    writer = _writers(str(tmp_path))[-1]
    task = TaskIdentity("q", "n", "4f1c0e2a-9b7d-4c55-8e1f-0a2b3c4d5e6f", 4, 0, 1)
    unit = writer.prepare_task(task, iter([rows_of([("a", 1)])]))
    with pytest.raises(ContinuousProcessingError):
        writer.commit([unit], 4)
    assert writer.find_decision("s", 4) is None
    (tmp_path / "offsets" / "4").write_text(MICRO_BATCH)
    writer.commit([unit], 4)
    assert writer.find_decision("s", 4) is not None


def test_a_micro_batch_offsets_file_is_not_taken_for_a_continuous_one() -> None:
    assert written_by_continuous(CONTINUOUS)
    assert not written_by_continuous(MICRO_BATCH)
    assert not written_by_continuous("v1")
    assert not written_by_continuous("")


def test_offsets_that_cannot_be_read_fail_no_batch(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The offsets check is a second guard: a WebHDFS that refuses the driver (here no
    server at all) is logged once, and the batch commits."""
    from pyspark.sql.datasource import WriterCommitMessage

    monkeypatch.setenv("EOS_WEBHDFS_URL", "http://127.0.0.1:1")
    writer = _writers("hdfs://127.0.0.1:1/checkpoints/unread")[2]
    writer.commit([WriterCommitMessage()], 3)
    writer.commit([WriterCommitMessage()], 4)
    warned = [r for r in caplog.records if "could not read offsets" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
