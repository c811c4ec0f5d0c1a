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

import pyarrow as pa
import pytest
from pyspark.sql.datasource import WriterCommitMessage

from eos_connectors.core import faults
from eos_connectors.core.batch_job import BatchWriter
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

    def __init__(self, store: str, endpoints: Endpoints, name: str) -> None:
        self.store, self.endpoints, self.name = store, endpoints, name

    def writer(self, version: int) -> BatchWriter:
        source = upsert_source(self.store, self.endpoints, self.name, txnVersion=str(version))
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
