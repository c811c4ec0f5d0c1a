"""A stream whose checkpoint is behind its sink's decisions is refused, in every
exactly-once sink, before it skips anything.

Found by probe (tests/spark/test_checkpoint_behind.py runs it in Spark): a query wrote
batches 0-4 of 200 records, a copy of its checkpoint was taken, the query went on to
batch 9, and the copy was restored; the restarted query, reading 500 records a batch,
planned batches 5-9 again over 2,000 records, which every sink skipped as decided (the
first run's batches 5-9 held only 1,000 of them): the other 1,000 were lost, silently.
Deleting the last ``offsets/`` files by hand does the same. Now the start is refused
when the sink decided a batch past the checkpoint's last planned one, and, where the
start cannot read the checkpoint (``s3a:``, or one set by conf only), the commit of a
batch whose tasks found it decided while the sink decided a later one. A batch job's
rerun of an older version still writes nothing, unrefused. Cost: ~8 s (seven cases).
"""

from __future__ import annotations

import json
import pickle
import shutil
import uuid
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from eos_connectors.core.checkpoint_behind import CheckpointBehindSinkError
from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.protocol import TwoPhaseCommitWriter
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.kafka import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter
from eos_connectors.sinks.kafka.checks import start_checks
from eos_connectors.sinks.kafka.options import KafkaSinkOptions
from eos_connectors.sinks.postgres import PostgresDataSource
from eos_connectors.sinks.redis import RedisDataSource
from eos_connectors.testing import CONTRACT_SCHEMA
from tests.kafka_sink_util import a_task, read_written
from tests.upsert_util import STORES, upserted

pytestmark = pytest.mark.services

_ARROW = pa.schema([pa.field("word", pa.string()), pa.field("n", pa.int64())])
#: Batches the sink decides before the checkpoint is taken back to ``KEPT``.
DECIDED, KEPT = 3, 1


def _checkpoint(folder: Path, query: str, batches: int) -> str:
    """A checkpoint as Spark leaves it after ``batches`` complete batches."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metadata").write_text(json.dumps({"id": query}))
    for log in ("offsets", "commits"):
        (folder / log).mkdir(exist_ok=True)
        for batch in range(batches):
            (folder / log / str(batch)).write_text("v1\n{}\n")
    return str(folder)


def _taken_back(checkpoint: str, to: int) -> None:
    """The checkpoint as an older copy of it holds it: batches past ``to`` gone."""
    for log in ("offsets", "commits"):
        for path in (Path(checkpoint) / log).iterdir():
            if int(path.name) > to:
                path.unlink()


def _source(store: str, endpoints: Endpoints, name: str, **options: str) -> object:
    if store == "postgres":
        return PostgresDataSource(
            {"dsn": endpoints.postgres_dsn, "table": name, "createTable": "true"}
            | {"mode": "upsert", "keyColumns": "word", **options}
        )
    return RedisDataSource(
        {"url": endpoints.redis_url, "keyPrefix": f"{name}:", "keyColumn": "word"}
        | {"valueColumns": "n", **options}
    )


def _batch(writer: TwoPhaseCommitWriter, query: str, batch: int, run: str) -> list[object]:
    """Batch ``batch``'s two tasks: ``w<batch>-<p>`` = 1."""
    units: list[object] = []
    for partition in range(2):
        task = TaskIdentity(query, None, run, batch, partition, batch * 10 + partition)
        rows = pa.RecordBatch.from_pydict({"word": [f"w{batch}-{partition}"], "n": [1]}, _ARROW)
        shipped: TwoPhaseCommitWriter = pickle.loads(pickle.dumps(writer))
        units.append(shipped.prepare_task(task, iter([rows])))
    return units


@pytest.mark.cost(1)
@pytest.mark.parametrize("store", STORES)
def test_a_checkpoint_behind_its_sink_is_refused_at_start_and_at_commit(
    endpoints: Endpoints, unique: str, store: str, tmp_path: Path
) -> None:
    """Batches 0-3 decided and applied; the checkpoint taken back to batch 1. Its start is
    refused, naming both batches; a start that cannot read the checkpoint goes on, and
    its batch 2 (other records than the sink's batch 2), which the tasks skip as decided,
    is refused at its commit. Nothing is written by either."""
    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path / "chk", query, DECIDED + 1)
    name = f"behind_{unique}_{store}"

    def writer(**options: str) -> TwoPhaseCommitWriter:
        made = _source(store, endpoints, name, sinkId=name, **options).streamWriter(  # type: ignore[attr-defined]
            CONTRACT_SCHEMA, False
        )
        assert isinstance(made, TwoPhaseCommitWriter)
        return made

    first = writer(checkpointLocation=checkpoint)
    for batch in range(DECIDED + 1):
        first.commit(_batch(first, query, batch, "run-1"), batch)  # type: ignore[arg-type]
    written = upserted(store, endpoints, name)
    assert len(written) == 2 * (DECIDED + 1)

    shutil.copytree(checkpoint, tmp_path / "copy")
    _taken_back(checkpoint, KEPT)
    with pytest.raises(
        CheckpointBehindSinkError, match=rf"decided batch {DECIDED}, .* up to batch {KEPT}"
    ):
        writer(checkpointLocation=checkpoint)
    writer(checkpointLocation=str(tmp_path / "copy"))  # the checkpoint as it was: taken

    unread = writer()  # the checkpoint set by conf: the sink is not told where it is
    replanned = [
        pickle.loads(pickle.dumps(unread)).prepare_task(
            TaskIdentity(query, None, "run-2", KEPT + 1, p, 100 + p),
            iter([pa.RecordBatch.from_pydict({"word": [f"new-{p}"], "n": [1]}, _ARROW)]),
        )
        for p in range(2)
    ]
    assert all(m.skipped for m in replanned)
    with pytest.raises(
        CheckpointBehindSinkError, match=rf"batch {KEPT + 1} .* up to batch {DECIDED}"
    ):
        unread.commit(replanned, KEPT + 1)
    assert upserted(store, endpoints, name) == written


def _kafka_rows(batch: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"key": [b"k"], "value": [f"b{batch}".encode()]})


@pytest.mark.cost(2)
@pytest.mark.parametrize("mode", ["batch", "task"])
def test_a_kafka_checkpoint_behind_its_sink_is_refused(
    endpoints: Endpoints, batch_commit_options: KafkaSinkOptions, mode: str, tmp_path: Path
) -> None:
    """The same with the Kafka sink: ``commitMode=batch`` refuses at the start (its
    decision pointer) and at the commit; ``commitMode=task``, whose markers are per task
    partition, at the commit (a task partition marked past the next batch)."""
    query = str(uuid.uuid4())
    checkpoint = _checkpoint(tmp_path, query, DECIDED + 1)
    raw = {"checkpointLocation": checkpoint}
    options = replace(batch_commit_options, commit_mode=mode)
    assert options.topic is not None
    made = BatchCommitWriter(options) if mode == "batch" else KafkaExactlyOnceWriter(options)

    def run(batch: int, attempt: str) -> list[object]:
        return [
            made.write_task(
                a_task(batch, run=attempt, partition=p, query=query), iter([_kafka_rows(batch)])
            )
            for p in range(2)
        ]

    start_checks(options, raw)
    for batch in range(DECIDED + 1):
        made.commit(run(batch, "run-1"), batch)  # type: ignore[arg-type]
    written = sorted(r.value for r in read_written(options.kafka, options.topic))
    assert len(written) == 2 * (DECIDED + 1)

    _taken_back(checkpoint, KEPT)
    if mode == "batch":
        with pytest.raises(
            CheckpointBehindSinkError, match=rf"decided batch {DECIDED}, .* up to batch {KEPT}"
        ):
            start_checks(options, raw)
    replanned = run(KEPT + 1, "run-2")
    assert all(
        getattr(m, "skipped", None) or getattr(m, "state", "") in ("marked", "decided")
        for m in replanned
    )
    with pytest.raises(
        CheckpointBehindSinkError, match=rf"batch {KEPT + 1} .* up to batch {DECIDED}"
    ):
        made.commit(replanned, KEPT + 1)  # type: ignore[arg-type]
    assert sorted(r.value for r in read_written(options.kafka, options.topic)) == written
