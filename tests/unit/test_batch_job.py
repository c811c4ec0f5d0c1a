"""A batch job's identity and its writer over the in-memory reference store: versions
write once, a rerun of a version writes nothing twice, bad options say what to set."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from dataclasses import dataclass

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

    def partitionId(self) -> int:
        return self.partition

    def taskAttemptId(self) -> int:
        return next(_ATTEMPTS)

    def getLocalProperty(self, key: str) -> str | None:
        return None  # no stream's batch: a plain batch write


def _rows(words: list[str]) -> Iterator[pa.RecordBatch]:
    yield pa.record_batch({"word": words, "n": [1] * len(words)})


def _run(
    monkeypatch: pytest.MonkeyPatch, server: str, version: int, crash_commit: bool = False
) -> None:
    """One run of a job: two tasks, then the driver's commit (a new run id each time)."""
    from pyspark import TaskContext

    job = batch_job.batch_job({"txnversion": str(version)}, "test", True, "job-a")
    assert job is not None
    sink = MemorySink(server, "job-a")
    writer = batch_job.BatchWriter(sink, job, batch_job.plan_job(sink, job, "test"))
    messages: list[WriterCommitMessage | None] = []
    for partition, words in enumerate((["a", "b"], ["c"])):
        monkeypatch.setattr(TaskContext, "get", staticmethod(lambda p=partition: _Context(p)))
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
