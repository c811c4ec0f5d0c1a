"""Issue 52, item 5: a batch job's version decided but not applied (its driver died
between decision and commit) lands before the next version's rows, never over them.

The protocol's hooks are driven as Spark drives them (the writer shipped to a task,
the driver's commit), against the real PostgreSQL and Redis; the crash is the
``after-decision`` fault point. On 0.2 ``commit`` applied the new version's units
and only then recovered the earlier one: the key kept version 1's value.
Cost: ~1 s.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest
from pyspark.sql.datasource import WriterCommitMessage

from eos_connectors.core import faults
from eos_connectors.core.batch_job import BatchWriter
from eos_connectors.core.checkpoint_behind import CheckpointBehindSinkError
from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.protocol import TwoPhaseCommitWriter
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.testing import CONTRACT_SCHEMA
from tests.upsert_util import STORES, upsert_source, upserted

pytestmark = pytest.mark.services

_ARROW = pa.schema([pa.field("word", pa.string()), pa.field("n", pa.int64())])
Value = Callable[[], object]


class Job:
    """One store's batch job ``df.write...save()`` with sinkId ``name``, each version run
    the way Spark runs it: the format's ``writer()`` on the driver, one task (the
    stream writer shipped by pickle), the driver's ``commit``."""

    def __init__(self, store: str, endpoints: Endpoints, name: str, **options: str) -> None:
        self.store, self.endpoints, self.name = store, endpoints, name
        self.options = options

    def writer(self, version: int) -> BatchWriter:
        source = upsert_source(
            self.store, self.endpoints, self.name, txnVersion=str(version), **self.options
        )
        found = source.writer(CONTRACT_SCHEMA, False)
        assert isinstance(found, BatchWriter)
        return found

    def task(self, writer: BatchWriter, n: int) -> WriterCommitMessage:
        """The job's one task, writing ``k`` = ``n``."""
        job = writer.job
        assert job is not None and isinstance(writer.stream, TwoPhaseCommitWriter)
        task = TaskIdentity(job.query_id, job.sink_id, job.run_id, job.version, 0, job.version)
        rows = pa.RecordBatch.from_pydict({"word": ["k"], "n": [n]}, schema=_ARROW)
        shipped: TwoPhaseCommitWriter = pickle.loads(pickle.dumps(writer.stream))
        return shipped.prepare_task(task, iter([rows]))

    def value(self) -> object:
        return upserted(self.store, self.endpoints, self.name).get("k")


@pytest.mark.parametrize("store", STORES)
def test_a_version_decided_but_not_applied_lands_before_the_next_version(
    endpoints: Endpoints, unique: str, store: str
) -> None:
    job = Job(store, endpoints, f"order_{unique}_{store}")
    first = job.writer(1)
    one = job.task(first, 1)
    with faults.simulate("after-decision@1"), pytest.raises(faults.SimulatedCrash):
        first.commit([one])
    assert job.value() is None, "version 1 was decided, not applied"

    second = job.writer(2)
    second.commit([job.task(second, 2)])
    assert job.value() == 2, "version 1's value landed over version 2's"
    assert isinstance(second.stream, TwoPhaseCommitWriter)
    assert second.stream.units_in_doubt(job.name) == []


@pytest.mark.parametrize("store", STORES)
def test_a_version_run_while_an_earlier_one_is_undecided_refuses_naming_it(
    endpoints: Endpoints, unique: str, store: str
) -> None:
    """Version 1 prepared and undecided (still running, or its driver died): version 2
    refuses before any task writes; once version 1 is rerun, version 2 writes."""
    job = Job(store, endpoints, f"undecided_{unique}_{store}")
    job.task(job.writer(1), 1)
    with pytest.raises(ConfigError, match=r"txnVersion 1 of job .* has prepared writes"):
        job.writer(2)
    assert job.value() is None
    rerun = job.writer(1)
    rerun.commit([job.task(rerun, 1)])
    second = job.writer(2)
    second.commit([job.task(second, 2)])
    assert job.value() == 2
    assert isinstance(second.stream, TwoPhaseCommitWriter)
    assert second.stream.units_in_doubt(job.name) == []


@pytest.mark.parametrize("store", STORES)
def test_a_foreach_batch_write_planned_again_over_other_positions_is_refused_at_its_plan(
    endpoints: Endpoints, unique: str, store: str, tmp_path: Path
) -> None:
    """A write from a stream's ``foreachBatch`` with ``txnVersion`` the batch id and
    ``streamCheckpoint`` the stream's checkpoint: its decision records the source
    positions of the stream's ``offsets/3``. The checkpoint put back by that one batch and
    planned again over more records: the write is refused at its plan, on the driver,
    before any task (its tasks would take it for a rerun and write nothing of it). The
    replay over the very file writes nothing more. Cost: ~0.3 s."""
    checkpoint = tmp_path / "chk"
    (checkpoint / "offsets").mkdir(parents=True)
    planned = 'v1\n{"batchTimestampMs":%d}\n{"orders":{"0":%d}}\n'
    (checkpoint / "offsets" / "3").write_text(planned % (1, 500))
    job = Job(store, endpoints, f"febone_{unique}_{store}", streamCheckpoint=str(checkpoint))
    first = job.writer(3)
    first.commit([job.task(first, 3)])
    assert job.value() == 3

    (checkpoint / "offsets" / "3").write_text(planned % (2, 800))
    with pytest.raises(CheckpointBehindSinkError, match=r"batch 3 .* other source positions"):
        job.writer(3)
    (checkpoint / "offsets" / "3").write_text(planned % (3, 500))  # the batch time aside
    replay = job.writer(3)
    message = job.task(replay, 4)
    assert getattr(message, "skipped", False)
    replay.commit([message])
    assert job.value() == 3
