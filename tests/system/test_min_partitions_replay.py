"""An operator retunes ``minPartitions`` between a failed batch and its replay: the replay is
split as the batch was first planned, so each task partition's progress marker still
speaks of the same records. The sink runs in its fallback ``commitMode=task``, where
each task commits on its own and the replay's split matters; the default batch commit
writes a failed batch again in full, whatever its split (tests/spark/test_kafka_batch_commit.py).

CI crosses the same retune in the conformance run (its records query restarts with 2, 6
and 4 tasks after a crash between two tasks' commits); this test is the retune alone, in
a pipeline of its own: 4 -> 2 in the second tier (`make full`, ~22 s: run it when the
source's planning or the Kafka sink's markers change), 2 -> 4 in `make soak`.
"""

from __future__ import annotations

import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

from eos_connectors.core.topics import read_to_end
from eos_connectors.dev.endpoints import Endpoints
from tests.pipeline_util import env, run
from tests.spark.test_operator_actions import RECORDS, _input

pytestmark = [pytest.mark.services, pytest.mark.spark]


def _to_kafka(
    endpoints: Endpoints, source: str, out: str, work: Path, sink_id: str, min_partitions: int
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "tests.pipelines.source_to_kafka",
        "--bootstrap",
        endpoints.kafka_bootstrap,
        "--topic",
        source,
        "--out-topic",
        out,
        "--checkpoint",
        str(work / "checkpoint"),
        "--sink-id",
        sink_id,
        "--min-partitions",
        str(min_partitions),
        "--commit-mode",
        "task",
    ]


@pytest.mark.cost(22)
@pytest.mark.parametrize(
    ("before", "after"),
    [pytest.param(4, 2, marks=pytest.mark.full), pytest.param(2, 4, marks=pytest.mark.soak)],
)
def test_a_replay_with_another_min_partitions_writes_each_record_once(
    endpoints: Endpoints, unique: str, tmp_path: Path, before: int, after: int
) -> None:
    """Batch 0 runs as ``before`` tasks; the last one dies after the others committed
    their transactions (the whole pipeline with it); the operator restarts the query
    with ``minPartitions=after``. The replay is split as the batch was first planned,
    so each task partition's progress marker still speaks of the same records."""
    source, out, values = _input(endpoints, unique)
    sink_id = f"op-{unique}"
    last = before - 1
    crash = env(
        EOS_FAULT_POINT=f"before-prepare@0#{last}",
        EOS_FAULT_SCOPE="group",
        EOS_FAULT_MARKER=str(tmp_path / "fired"),
    )
    first = _to_kafka(endpoints, source, out, tmp_path, sink_id, before)
    assert run(first, crash) == -signal.SIGKILL
    written = read_to_end(endpoints.kafka, out)
    assert len(written) == RECORDS * last // before, "the other tasks committed first"

    second = _to_kafka(endpoints, source, out, tmp_path, sink_id, after)
    assert run(second, env()) == 0
    counts = Counter(r.value for r in read_to_end(endpoints.kafka, out))
    lost = [v for v in values if v not in counts]
    duplicated = [v for v, n in counts.items() if n > 1]
    assert (len(lost), len(duplicated)) == (0, 0), f"{len(lost)} lost, {len(duplicated)} twice"
    assert sorted(counts) == sorted(values)
