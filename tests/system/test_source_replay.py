"""Crash the query process and restart it from its checkpoint: batches replay exactly.

The pipeline runs as its own process group (tests/pipelines/source_to_files.py),
so SIGKILL takes the driver, the JVM and the Python workers down together.

In ``make full``, not CI: CI's conformance run kills a task at ``source-read`` and its
Kafka-sink queries, which write per task partition, would lose or duplicate records
if a replay read other records (the records cell counts every record); this test
shows the replay batch by batch, offsets and records, which costs a pipeline process
of its own (15-19 s in CI).
"""

from __future__ import annotations

import json
import random
import signal
import sys
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from eos_connectors.core.topics import Record, create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sources.kafka.offsets import from_spark
from tests.kafka_util import produce_mixed
from tests.pipeline_util import env, fault_env, kill_when, progress_after, run
from tests.pipelines import source_to_files

pytestmark = [pytest.mark.services, pytest.mark.spark]

ROOT = Path(__file__).resolve().parents[2]


def _command(endpoints: Endpoints, topic: str, work: Path, trigger: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tests.pipelines.source_to_files",
        "--bootstrap",
        endpoints.kafka_bootstrap,
        "--topic",
        topic,
        "--checkpoint",
        str(work / "checkpoint"),
        "--out",
        str(work / "out"),
        "--max-offsets",
        "60",
        "--trigger",
        trigger,
    ]


def _offsets(checkpoint: Path, batch: int) -> dict[int, int]:
    """The source's end offsets Spark recorded in ``offsets/<batch>``."""
    lines = (checkpoint / "offsets" / str(batch)).read_text().splitlines()
    return {p: o for (_topic, p), o in from_spark(json.loads(lines[-1])).items()}


def _committed(checkpoint: Path) -> list[int]:
    return sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def _batch(out: Path, batch: int) -> list[Record]:
    rows = json.loads((out / f"batch-{batch}.json").read_text())
    return sorted(Record(p, o, None, v.encode()) for p, o, v in rows)


def _expected_batches(
    endpoints: Endpoints, topic: str, checkpoint: Path, batches: list[int]
) -> dict[int, list[Record]]:
    """Each batch's records as a plain consumer reads [offsets/N-1, offsets/N)."""
    last = _offsets(checkpoint, batches[-1])
    everything = read_to_end(endpoints.kafka, topic, ranges={p: (0, o) for p, o in last.items()})
    expected = {}
    for batch in batches:
        end = _offsets(checkpoint, batch)
        start = _offsets(checkpoint, batch - 1) if batch > 0 else dict.fromkeys(end, 0)
        expected[batch] = sorted(
            Record(r.partition, r.offset, None, r.value)
            for r in everything
            if start.get(r.partition, 0) <= r.offset < end[r.partition]
        )
    return expected


def _check_every_batch(endpoints: Endpoints, topic: str, work: Path, visible: set[bytes]) -> None:
    checkpoint, out = work / "checkpoint", work / "out"
    batches = _committed(checkpoint)
    assert batches == list(range(len(batches))), f"gap in committed batches: {batches}"
    expected = _expected_batches(endpoints, topic, checkpoint, batches)
    seen: list[bytes] = []
    for batch in batches:
        got = _batch(out, batch) if (out / f"batch-{batch}.json").exists() else []
        assert got == expected[batch], f"batch {batch} read other records than its offsets say"
        seen.extend(r.value for r in got)
    assert len(seen) == len(set(seen)), "overlap: a record was read by two batches"
    assert set(seen) == visible, f"gap: {len(visible - set(seen))} records never read"


@pytest.mark.full
@pytest.mark.cost(14)
def test_a_crashed_batch_replays_the_same_offsets_and_records(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """The pipeline killed while a task of batch 2 reads; the replay (in the session's
    Spark) reads the very offsets and records batch 2 was planned with."""
    topic = f"replay-{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    visible = produce_mixed(
        endpoints.kafka_bootstrap, topic, 2, transactions=9, per_txn=40, txn_id=unique
    )
    command = _command(endpoints, topic, tmp_path, "available-now")
    checkpoint = tmp_path / "checkpoint"

    fault = fault_env("source-read", 2, tmp_path / "fired")
    assert run(command, fault) == -signal.SIGKILL
    # Spark wrote offsets/2 before the tasks ran; the crash came before commits/2.
    assert (checkpoint / "offsets" / "2").exists()
    assert _committed(checkpoint) == [0, 1]
    planned = (checkpoint / "offsets" / "2").read_text()

    source_to_files.run(
        spark, endpoints.kafka_bootstrap, topic, str(checkpoint), tmp_path / "out", "60"
    )
    assert (checkpoint / "offsets" / "2").read_text() == planned  # replayed, not re-planned
    _check_every_batch(endpoints, topic, tmp_path, visible)
    # Written through the raw local file system (eos_connectors.ops.session.LOCAL_FILES_RAW).
    assert not list(checkpoint.rglob("*.crc")), "checksum files beside the checkpoint's"


@pytest.mark.soak
def test_five_restarts_in_a_row_leave_no_gap_and_no_overlap(
    endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic = f"restarts-{unique}"
    create_topic(endpoints.kafka, topic, partitions=3)
    visible = produce_mixed(
        endpoints.kafka_bootstrap, topic, 3, transactions=30, per_txn=60, txn_id=unique
    )
    command = _command(endpoints, topic, tmp_path, "continuous")
    checkpoint = tmp_path / "checkpoint"
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"kill schedule seed {seed}")
    for _ in range(5):  # each time: after one more batch, at a random moment
        kill_when(command, env(), progress_after(checkpoint), rng.uniform(0, 1.5))
    assert run(_command(endpoints, topic, tmp_path, "available-now"), env()) == 0
    _check_every_batch(endpoints, topic, tmp_path, visible)
