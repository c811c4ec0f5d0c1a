"""The Kafka sink's batch-job rules (sinks/kafka/jobs.py) from what the marker log holds:
which runs write nothing, which are refused, and in what shape a partly written
version may be rerun. The same rules against a real broker and Spark:
tests/spark/test_batch_write.py."""

from __future__ import annotations

import pytest

from eos_connectors.core.batch_job import BatchJob, JobPlan
from eos_connectors.core.errors import ConfigError
from eos_connectors.sinks.kafka.jobs import JobRecord, JobStanding

QUERY = "job-j"


def _plan(version: int, written: dict[int, int], record: JobRecord | None = None) -> JobPlan:
    return JobStanding(written, record).plan(BatchJob("j", version, "run"))


def test_a_version_at_or_below_a_written_or_completed_one_writes_nothing() -> None:
    assert _plan(4, {0: 6, 1: 6}).skip == "txnVersion 6 was written before"
    assert _plan(6, {0: 6}, JobRecord(6, True, 2, QUERY)).skip.endswith("committed before")
    assert _plan(5, {}, JobRecord(6, True, 2, QUERY)).skip  # markers gone, the record kept
    assert _plan(7, {0: 6, 1: 6}, JobRecord(6, True, 2, QUERY)) == JobPlan()


def test_a_partly_written_version_is_rerun_in_its_first_shape_and_nothing_after_it() -> None:
    partial = JobRecord(7, False, 2, QUERY)
    assert _plan(7, {0: 7, 1: 6}, partial) == JobPlan(tasks=2, written=(0,))
    assert _plan(7, {0: 7, 1: 6}) == JobPlan(tasks=None, written=(0,))  # its driver died
    with pytest.raises(ConfigError, match="txnVersion 7 of job 'j' was partly written"):
        _plan(8, {0: 7, 1: 6}, partial)
