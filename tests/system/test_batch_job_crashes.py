"""A batch job (``df.write``) into the three sinks killed at every fault point of every sink,
then run again: each record is written once (a batch job is batch ``txnVersion`` of job
``sinkId`` in the streaming protocol). The job runs as a process of its own
(tests/pipelines/batch_job.py), since a kill at a driver point takes the process.

Cost: ~100-115 s in CI beside the services tier (two runs of the job as processes, a
third in the session's Spark).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from tests.pipeline_util import env, run
from tests.pipelines import batch_job
from tests.spark.test_batch_write import (
    RECORDS,
    _expected_counts,
    _kafka_values,
    _produce_input,
    _redis_counts,
    _table_ids,
)

pytestmark = [pytest.mark.services, pytest.mark.spark]


@pytest.mark.parametrize(
    "whole",
    [
        pytest.param(("postgres",), id="postgres", marks=pytest.mark.cost(110)),
        pytest.param(("postgres", "redis"), id="postgres-redis", marks=pytest.mark.soak),
    ],
)
def test_a_batch_job_killed_at_every_point_and_rerun_writes_each_record_once(
    spark: SparkSession,
    endpoints: Endpoints,
    unique: str,
    tmp_path: Path,
    whole: tuple[str, ...],
) -> None:
    """Every fault point of every sink crossed once, each a kill: of a task or of the
    commit (the job fails and is run again, as a scheduler's retry would), or of the
    whole driver between the decision and the commits of the sinks in ``whole`` (the
    test runs the job again, with the same ``txnVersion``, in a new Spark application).
    CI kills the whole driver after PostgreSQL's decision and, after Redis's, only the
    commit's process (a third application cost ~30 s); make soak kills the whole driver
    after both."""
    source, out = f"bjob-in-{unique}", f"bjob-out-{unique}"
    _produce_input(endpoints.kafka_bootstrap, source)
    create_topic(endpoints.kafka, out, partitions=2)
    prefix, table = f"bjob-{unique}", f"bjob_{unique}".replace("-", "_")
    kafka, postgres, rds = (f"{prefix}-eos_{s}" for s in ("kafka", "postgres", "redis"))
    entries = [
        "source-read",
        f"before-prepare:{kafka}",
        f"after-prepare:{kafka}",
        f"after-commit:{kafka}",
        *(f"{p}:{postgres}" for p in ("before-prepare", "mid-prepare", "after-prepare")),
        f"after-decision:{postgres}" + ("=group" if "postgres" in whole else ""),
        *(f"{p}:{postgres}" for p in ("between-commits", "after-commit")),
        *(f"{p}:{rds}" for p in ("before-prepare", "mid-prepare", "after-prepare")),
        f"after-decision:{rds}" + ("=group" if "redis" in whole else ""),
        *(f"{p}:{rds}" for p in ("between-commits", "after-commit")),
    ]
    markers = tmp_path / "fired"
    markers.mkdir()
    command = [
        sys.executable,
        "-m",
        "tests.pipelines.batch_job",
        f"--bootstrap={endpoints.kafka_bootstrap}",
        f"--topic={source}",
        f"--out-topic={out}",
        f"--dsn={endpoints.postgres_dsn}",
        f"--table={table}",
        f"--redis-url={endpoints.redis_url}",
        f"--prefix={prefix}",
        "--version=7",
    ]
    faults = env(
        EOS_FAULT_POINT=",".join(entries),
        EOS_FAULT_SCOPE="process",
        EOS_FAULT_MARKER=str(markers),
    )
    codes = [run(command, faults, timeout=300) for _ in range(len(whole) + 1)]
    assert codes == [-9] * len(whole) + [0], f"exit codes {codes}"
    fired = sorted(p.name for p in markers.iterdir())
    assert len(fired) == len(entries), f"points that never fired: {entries} vs {fired}"

    inputs = Counter(f"r{i}".encode() for i in range(RECORDS))
    assert _kafka_values(endpoints.kafka_bootstrap, out) == inputs
    assert _table_ids(endpoints.postgres_dsn, table) == Counter(v.decode() for v in inputs)
    assert _redis_counts(endpoints.redis_url, prefix) == _expected_counts()

    # The same version once more, with no faults (in this session's Spark): nothing is
    # written.
    job = batch_job.Job(endpoints.kafka_bootstrap, source, out, endpoints.postgres_dsn, table,
                        endpoints.redis_url, prefix, "7")  # fmt: skip
    batch_job.run(spark, job)
    assert _kafka_values(endpoints.kafka_bootstrap, out) == inputs
    assert sum(_table_ids(endpoints.postgres_dsn, table).values()) == RECORDS
    assert _redis_counts(endpoints.redis_url, prefix) == _expected_counts()
