"""What differs between the supported PySpark releases (connectors/core/spark_api.py), checked
on the release CI runs; `make spark-matrix` runs the quickstart and the conformance suite on
every one.

- The task context carries the batch id, query id and run id the sinks name units by.
- The reader of PySpark 4.0-4.1 (`latestOffset()` with no start nor limit) plans every
  record once, in Spark's call order on those releases (a restarted query's last batch
  planned again before anything else), with `legacyReadLimits` bounding each batch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sources.kafka.options import parse_options
from eos_connectors.sources.kafka.stream_reader import LegacyKafkaStreamReader
from tests.kafka_util import produce_plain

pytestmark = [pytest.mark.services, pytest.mark.spark]


@pytest.mark.full  # every sink test of CI's release depends on it; the matrix runs it on each
@pytest.mark.cost(15)
def test_every_task_reads_the_batch_query_and_run_ids_the_driver_commits() -> None:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    run = subprocess.run(
        [sys.executable, "-m", "eos_connectors.dev.release_check"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "match the driver's" in run.stdout


def _read_all(
    reader: LegacyKafkaStreamReader, start: dict[str, Any], end: dict[str, Any]
) -> list[int]:
    values: list[int] = []
    for partition in reader.partitions(start, end):
        for batch in reader.read(partition):
            values.extend(int(v) for v in batch.column("value").to_pylist())
    return values


@pytest.mark.cost(3)
def test_the_legacy_reader_bounds_batches_and_reads_each_record_once_across_a_restart(
    endpoints: Endpoints, unique: str
) -> None:
    topic = f"legacy-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    produce_plain(endpoints.kafka_bootstrap, topic, [str(i).encode() for i in range(100)])
    options = parse_options(
        {
            "kafka.bootstrap.servers": endpoints.kafka_bootstrap,
            "subscribe": topic,
            "startingOffsets": "earliest",
            "maxOffsetsPerTrigger": "30",
            "legacyReadLimits": "true",
        }
    )
    # A new query on 4.0-4.1: latestOffset() first, then initialOffset(), then the batch.
    reader = LegacyKafkaStreamReader(options)
    end = reader.latestOffset()
    start = reader.initialOffset()
    seen = _read_all(reader, start, end)
    assert len(seen) == 30
    start, end = end, reader.latestOffset()
    seen += _read_all(reader, start, end)
    assert len(seen) == 60
    # A restart: a new reader; Spark plans the checkpoint's last batch again first.
    restarted = LegacyKafkaStreamReader(options)
    restarted.partitions(end, end)
    start, end = end, restarted.latestOffset()
    seen += _read_all(restarted, start, end)
    start, end = end, restarted.latestOffset()
    seen += _read_all(restarted, start, end)
    assert start != end
    assert restarted.latestOffset() == end  # nothing new: the same offset, no batch
    assert sorted(seen) == list(range(100))


@pytest.mark.cost(1)
def test_the_legacy_reader_refuses_a_batch_that_would_end_before_its_start(
    endpoints: Endpoints, unique: str
) -> None:
    topic = f"legacy-back-{unique}"
    create_topic(endpoints.kafka, topic)
    produce_plain(endpoints.kafka_bootstrap, topic, [str(i).encode() for i in range(10)])
    raw = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "subscribe": topic}
    reader = LegacyKafkaStreamReader(parse_options({**raw, "startingOffsets": "earliest"}))
    end = reader.latestOffset()
    behind = LegacyKafkaStreamReader(parse_options({**raw, "startingOffsets": "earliest"}))
    early = {**behind.initialOffset()}
    with pytest.raises(Exception, match="end before its start"):
        behind.partitions(end, early)
