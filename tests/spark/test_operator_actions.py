"""Exactly once whatever the operator does between a failed batch and its replay.

Each test here is an ordinary operator action that once broke the guarantee
silently: a tuning option changed before a restart, a sink id reused by a new
checkpoint, a resume or a reset while the query could still replay a batch.
"""

from __future__ import annotations

import signal
import sys
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from tests.kafka_util import produce_plain
from tests.pipeline_util import env, run

pytestmark = [pytest.mark.services, pytest.mark.spark]

RECORDS = 2_000
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def _to_kafka(
    endpoints: Endpoints,
    source: str,
    out: str,
    work: Path,
    sink_id: str,
    min_partitions: int,
    cores: int = 1,
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
        "--cores",
        str(cores),
    ]


def _input(endpoints: Endpoints, unique: str) -> tuple[str, str, list[bytes]]:
    source, out = f"op-in-{unique}", f"op-out-{unique}"
    create_topic(endpoints.kafka, source, partitions=2)
    create_topic(endpoints.kafka, out, partitions=2)
    values = [f"{unique}-{i}".encode() for i in range(RECORDS)]
    for partition in (0, 1):
        produce_plain(endpoints.kafka_bootstrap, source, values[partition::2], partition)
    return source, out, values


@pytest.mark.parametrize(
    ("before", "after"),
    # 4 -> 2 in CI; 2 -> 4 in `make soak` (the conformance cells' records query restarts
    # with 2, 6 and 4 tasks in CI too).
    [(4, 2), pytest.param(2, 4, marks=pytest.mark.soak)],
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


def test_a_new_checkpoint_that_reuses_a_kafka_sink_id_writes_nothing_anywhere(
    endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """The first query writes through sink id S with 2 tasks a batch; a second query, on a
    new checkpoint with the same S, reads with 4 tasks side by side: its tasks on task
    partitions the first query never wrote are refused too (the sink id's claim), so
    it fails having written nothing at all."""
    source, out, values = _input(endpoints, unique)
    sink_id = f"op-{unique}"
    first = _to_kafka(endpoints, source, out, tmp_path / "first", sink_id, 2, cores=2)
    assert run(first, env()) == 0
    second = _to_kafka(endpoints, source, out, tmp_path / "second", sink_id, 4, cores=2)
    assert run(second, env()) != 0, "the second query must fail"
    written = Counter(r.value for r in read_to_end(endpoints.kafka, out))
    assert sum(written.values()) == RECORDS, f"{sum(written.values()) - RECORDS} written twice"
    assert sorted(written) == sorted(values)


def _eos(*args: str) -> tuple[int, str]:
    """``eos ARGS`` in this process: its exit code and what it wrote to stderr."""
    import contextlib
    import io

    from eos_connectors.cli import main

    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        code = main(list(args))
    return code, errors.getvalue()


def _kafka_only(monkeypatch: pytest.MonkeyPatch, endpoints: Endpoints) -> None:
    for name, value in endpoints.as_env().items():
        monkeypatch.setenv(name, value)


def test_resume_and_reset_refuse_while_the_owning_query_can_still_replay_or_runs(
    endpoints: Endpoints, unique: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One query into a Kafka sink id, two batches. Resuming a savepoint of it checks the
    sink its checkpoint records: refused when the environment cannot reach that sink (it
    once passed, finding no sink at all), while the sink looks alive, and with
    ``--no-sinks``; it goes on once all is known, the original retired. ``eos sinks
    reset`` of the sink id, given the (resumed) checkpoint: refused while its last batch
    is uncommitted (a restart replays it), while the sink holds markers past it (a stale
    copy, or a query that ran on), and while the sink wrote recently (a live query);
    then done, and a new query can claim the sink id."""
    import shutil

    from tests.kafka_util import uncommit

    _kafka_only(monkeypatch, endpoints)
    source, out, values = _input(endpoints, unique)
    sink_id, checkpoint = f"op-{unique}", tmp_path / "checkpoint"
    assert run(_to_kafka(endpoints, source, out, tmp_path, sink_id, 2), env()) == 0
    stale = tmp_path / "stale"
    shutil.copytree(checkpoint, stale)
    produce_plain(endpoints.kafka_bootstrap, source, [b"one-more"], 0)
    assert run(_to_kafka(endpoints, source, out, tmp_path, sink_id, 2), env()) == 0
    interrupted = tmp_path / "interrupted"
    shutil.copytree(checkpoint, interrupted)
    uncommit(interrupted, 1)

    root = str(tmp_path / "savepoints")
    assert _eos("savepoint", "--dir", root, "create", str(checkpoint), "--name", "sp")[0] == 0

    def resume(to: str, *extra: str) -> tuple[int, str]:
        target = str(tmp_path / to)
        return _eos(
            "savepoint", "--dir", root, "restore", "sp", "--to", target, "--mode", "resume", *extra
        )

    monkeypatch.delenv("EOS_KAFKA_BOOTSTRAP")
    code, said = resume("r1", "--quiet-seconds", "0")
    assert code == 2 and f"sink {sink_id} in kafka" in said and "EOS_KAFKA_BOOTSTRAP" in said
    monkeypatch.setenv("EOS_KAFKA_BOOTSTRAP", endpoints.kafka_bootstrap)
    code, said = resume("r2")
    assert code == 2 and "looks alive" in said, said
    code, said = resume("r3", "--no-sinks")
    assert code == 2 and "records sinks" in said, said
    assert resume("resumed", "--quiet-seconds", "0") == (0, "")
    assert not checkpoint.exists(), "the original was retired"

    def reset(path: Path, quiet: str = "0") -> tuple[int, str]:
        return _eos(
            "sinks", "reset", sink_id, "--checkpoint", str(path), "--quiet-seconds", quiet, "--yes"
        )

    code, said = reset(interrupted)
    assert code == 2 and "replays that batch" in said, said
    code, said = reset(stale)
    assert code == 2 and "decided batch 1, past batch 0" in said, said
    code, said = reset(tmp_path / "resumed", quiet="3600")
    assert code == 2 and "looks alive" in said, said
    assert reset(tmp_path / "resumed") == (0, "")
    second = _to_kafka(endpoints, source, out, tmp_path / "new", sink_id, 2)
    assert run(second, env()) == 0, "a new query claims the reset sink id"
    counts = Counter(r.value for r in read_to_end(endpoints.kafka, out))
    assert all(counts[v] == 2 for v in values), "the new query wrote its input once more"


def test_rescale_refuses_the_default_state_store_before_taking_anything(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """Spark repartitions RocksDB state only. A query on the default (HDFS-backed) store
    is refused up front, naming the provider and what to do, with no savepoint taken
    (it once took one, then failed with Py4J's text)."""
    from eos_connectors.ops.checkpoint import CheckpointError
    from eos_connectors.ops.savepoints import list_savepoints, rescale
    from tests.sink_util import earliest

    source, _out, _values = _input(endpoints, unique)
    key = "spark.sql.streaming.stateStore.providerClass"
    before = str(spark.conf.get(key))
    spark.conf.set(key, HDFS_PROVIDER)
    try:
        counts = earliest(spark, endpoints, source).groupBy("partition").count()
        query = (
            counts.writeStream.format("noop")
            .outputMode("complete")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
    finally:
        spark.conf.set(key, before)
    root = tmp_path / "savepoints"
    with pytest.raises(CheckpointError, match=r"HDFSBackedStateStoreProvider.*Nothing was changed"):
        rescale(spark, tmp_path / "checkpoint", 3, root)
    assert list_savepoints(root) == [], "a savepoint was taken before the refusal"
