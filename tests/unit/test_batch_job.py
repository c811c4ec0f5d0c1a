"""A batch job's identity and its writer over the in-memory reference store: versions
write once, a rerun of a version writes nothing twice, bad options say what to set."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.datasource import WriterCommitMessage

from eos_connectors.core import batch_job
from eos_connectors.core.errors import ConfigError
from eos_connectors.testing.memory import MemorySink, memory_server

_ATTEMPTS = itertools.count(1)


@dataclass
class _Context:
    partition: int
    #: The stream's batch id a ``foreachBatch`` write's tasks see; None: a plain write.
    batch: str | None = None

    def partitionId(self) -> int:
        return self.partition

    def taskAttemptId(self) -> int:
        return next(_ATTEMPTS)

    def getLocalProperty(self, key: str) -> str | None:
        return self.batch if key == "streaming.sql.batchId" else None


def _rows(words: list[str]) -> Iterator[pa.RecordBatch]:
    yield pa.record_batch({"word": words, "n": [1] * len(words)})


def _run(
    monkeypatch: pytest.MonkeyPatch,
    server: str,
    version: int,
    crash_commit: bool = False,
    stream_checkpoint: Path | None = None,
    stream_batch: str | None = None,
) -> None:
    """One run of a job: two tasks, then the driver's commit (a new run id each time);
    ``stream_checkpoint``: the ``streamCheckpoint`` option; ``stream_batch``: the batch
    id of the stream whose ``foreachBatch`` runs the write."""
    from pyspark import TaskContext

    options = {"txnversion": str(version)}
    if stream_checkpoint is not None:
        options["streamcheckpoint"] = str(stream_checkpoint)
    job = batch_job.batch_job(options, "test", True, "job-a")
    assert job is not None
    sink = MemorySink(server, "job-a")
    writer = batch_job.BatchWriter(sink, job, batch_job.plan_job(sink, job, "test"))
    messages: list[WriterCommitMessage | None] = []
    for partition, words in enumerate((["a", "b"], ["c"])):
        context = _Context(partition, stream_batch)
        monkeypatch.setattr(TaskContext, "get", staticmethod(lambda c=context: c))
        messages.append(writer.write(_rows(words)))
    if not crash_commit:
        writer.commit(messages)


def test_each_version_writes_once_and_a_rerun_or_an_older_version_writes_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server = "batch-job-versions"
    _run(monkeypatch, server, 5, crash_commit=True)  # the driver died before deciding
    assert not memory_server(server).data
    _run(monkeypatch, server, 5)
    assert memory_server(server).data == {"a": 1, "b": 1, "c": 1}
    with caplog.at_level(logging.WARNING):
        _run(monkeypatch, server, 5)
        _run(monkeypatch, server, 4)
    assert memory_server(server).data == {"a": 1, "b": 1, "c": 1}
    assert caplog.text.count("was committed before") == 2
    _run(monkeypatch, server, 6)
    assert memory_server(server).data == {"a": 2, "b": 2, "c": 2}
    assert not memory_server(server).staged, "the crashed run's units were settled"


def test_an_exactly_once_batch_write_names_the_options_it_misses() -> None:
    with pytest.raises(ConfigError, match="options 'sinkId' and 'txnVersion' are not set"):
        batch_job.batch_job({}, "eos_x", True, None)
    with pytest.raises(ConfigError, match="option 'txnVersion' is not set"):
        batch_job.batch_job({}, "eos_x", True, "job")
    with pytest.raises(ConfigError, match="whole number"):
        batch_job.batch_job({"txnVersion": "2026-11-25"}, "eos_x", True, "job")
    assert batch_job.batch_job({}, "eos_x", False, None) is None
    job = batch_job.batch_job({"TXNVERSION": " 7 "}, "eos_x", True, "job")
    assert job is not None and (job.version, job.query_id) == (7, "job-job")


def test_a_stream_refuses_txn_version_and_a_batch_refuses_overwrite() -> None:
    with pytest.raises(ConfigError, match="is for batch writes"):
        batch_job.refuse_in_stream({"txnVersion": "1"}, "eos_x")
    batch_job.refuse_in_stream({}, "eos_x")
    with pytest.raises(ConfigError, match="'overwrite' is not supported: do this"):
        batch_job.refuse_overwrite(True, "eos_x", "do this")


def _offsets(checkpoint: Path, batch: int, end: int) -> None:
    """The stream's ``offsets/<batch>``, planned up to position ``end``."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    text = f'v1\n{{"batchTimestampMs":{end}}}\n{{"orders":{{"0":{end}}}}}\n'
    (checkpoint / "offsets" / str(batch)).write_text(text)


def test_a_foreach_batch_write_planned_again_over_other_positions_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With ``streamCheckpoint``, a version's decision records the source positions the
    stream's ``offsets/<version>`` planned: a replay (the same file) writes nothing, as
    any rerun; the batch planned again over other positions (a checkpoint put back by
    one batch, with more input since) is refused before any task, not taken for a
    rerun that writes nothing of it."""
    from eos_connectors.core.checkpoint_behind import CheckpointBehindSinkError, planned_offsets

    server, checkpoint = "batch-job-stream-checkpoint", tmp_path / "chk"
    _offsets(checkpoint, 3, 500)
    _run(monkeypatch, server, 3, stream_checkpoint=checkpoint)
    decision = MemorySink(server, "job-a").find_decision("job-a", 3)
    assert decision is not None
    assert decision.offsets == planned_offsets((checkpoint / "offsets" / "3").read_text())
    _run(monkeypatch, server, 3, stream_checkpoint=checkpoint)  # the replay: nothing more
    assert memory_server(server).data == {"a": 1, "b": 1, "c": 1}
    _offsets(checkpoint, 3, 800)
    with pytest.raises(
        CheckpointBehindSinkError, match=r"batch 3 .* other source .*streamCheckpoint.*new sinkIds"
    ):
        _run(monkeypatch, server, 3, stream_checkpoint=checkpoint)
    _run(monkeypatch, server, 3)  # without the option the check is not made
    assert memory_server(server).data == {"a": 1, "b": 1, "c": 1}


def test_a_stream_checkpoint_that_cannot_tell_the_batch_is_refused(tmp_path: Path) -> None:
    """A wrong ``streamCheckpoint`` (no ``offsets/<txnVersion>`` there, a store the
    package cannot read) or one on an at-least-once write is named, before anything."""
    _offsets(tmp_path, 3, 500)
    option = {"txnVersion": "4", "streamCheckpoint": str(tmp_path)}
    with pytest.raises(ConfigError, match=r"has no offsets/4: set 'streamCheckpoint' to the"):
        batch_job.batch_job(option, "eos_x", True, "job")
    s3 = {"txnVersion": "3", "streamCheckpoint": "s3a://bucket/chk"}
    with pytest.raises(ConfigError, match="'streamCheckpoint' 's3a://bucket/chk' is not"):
        batch_job.batch_job(s3, "eos_x", True, "job")
    with pytest.raises(ConfigError, match="'streamCheckpoint' is for exactly-once batch"):
        batch_job.batch_job(option, "eos_x", False, "job")
    job = batch_job.batch_job({**option, "txnVersion": "3"}, "eos_x", True, "job")
    assert job is not None and job.planned != ""


def test_the_kafka_sinks_task_mode_refuses_a_stream_checkpoint(tmp_path: Path) -> None:
    """``commitMode=task`` keeps no decision to record the stream's positions in: the
    option is refused at the plan, before any network call, naming the mode to use."""
    from eos_connectors.sinks.kafka import KafkaExactlyOnceWriter
    from eos_connectors.sinks.kafka.options import parse_options

    _offsets(tmp_path, 3, 500)
    job = batch_job.batch_job(
        {"txnVersion": "3", "streamCheckpoint": str(tmp_path)}, "eos_kafka", True, "job"
    )
    assert job is not None
    kafka = {"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t", "commitMode": "task"}
    writer = KafkaExactlyOnceWriter(parse_options(kafka), None)
    with pytest.raises(ConfigError, match="'streamCheckpoint' needs commitMode=batch"):
        writer.plan_job(job)


def test_a_foreach_batch_write_without_stream_checkpoint_is_warned_of_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A write from a stream's ``foreachBatch`` with ``txnVersion`` its batch id and no
    ``streamCheckpoint`` cannot tell that batch planned again over other positions from a
    rerun: its driver warns once, naming the option, and writes as before. Outside a
    stream, with another version, or with the option, no warning."""
    server = "batch-job-foreach-warning"
    with caplog.at_level(logging.WARNING, logger="eos_connectors.core.batch_job"):
        _run(monkeypatch, server, 1)  # a plain batch write
        _run(monkeypatch, server, 2, stream_batch="7")  # another versioning
        _offsets(tmp_path, 3, 500)
        _run(monkeypatch, server, 3, stream_checkpoint=tmp_path, stream_batch="3")
        assert "streamCheckpoint" not in caplog.text
        _run(monkeypatch, server, 4, stream_batch="4")
        _run(monkeypatch, server, 5, stream_batch="5")
    assert caplog.text.count("without option 'streamCheckpoint'") == 1
    assert "job 'job-a' runs in a stream's foreachBatch (txnVersion 4" in caplog.text
    assert memory_server(server).data == {"a": 5, "b": 5, "c": 5}
