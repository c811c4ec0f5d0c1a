"""Checkpoint inspection and savepoints on a real stateful query.

The query counts records per key (state in RocksDB) from eos_kafka into an
eos_postgres upsert table, under an explicit sinkId. Each step is what a user
does: inspect, take a savepoint, go on, restore it as a fork into a new table
(the state carries over, the records after the savepoint are read again),
restore it into the old sink id (refused by the sink), resume (refused while the
sink is ahead, allowed at the last batch, the original retired), rescale the state.
Each runs with its checkpoints and savepoints on a local disk and on HDFS.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from pyspark.sql import SparkSession

from eos_connectors.cli import main
from eos_connectors.core import spark_api
from eos_connectors.core.sinks_admin import SinkRecord
from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.ops.checkpoint import CheckpointError, read_checkpoint
from eos_connectors.ops.inspect import add_key_counts, inspect
from eos_connectors.ops.locations import (
    HadoopPath,
    Location,
    children,
    is_local,
    remove_tree,
    rename,
)
from eos_connectors.ops.savepoints import create, find, list_savepoints, rescale, restore
from eos_connectors.ops.session import STATE_FORMAT
from eos_connectors.ops.state import key_counts, plan_read, read_state, state_rows
from eos_connectors.ops.stores import recorded_sinks
from eos_connectors.sinks.postgres.admin import PostgresSinkAdmin
from tests.kafka_util import produce_plain
from tests.sink_util import BOUNDED, earliest, to_the_end

pytestmark = [pytest.mark.services, pytest.mark.spark]

KEYS = [f"k{i}" for i in range(10)]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["local", pytest.param("hdfs", marks=pytest.mark.hdfs)])
def base(request: pytest.FixtureRequest, tmp_path: Path, unique: str) -> Iterator[Location]:
    """Where a test keeps its checkpoints and savepoints: a local directory, or one on
    the stack's HDFS (removed afterwards)."""
    if request.param == "local":
        yield tmp_path
        return
    where = HadoopPath(f"{request.getfixturevalue('hdfs_url')}/tests/{unique}")
    yield where
    remove_tree(where)


def _produce(endpoints: Endpoints, topic: str, rounds: int) -> None:
    produce_plain(
        endpoints.kafka_bootstrap, topic, [k.encode() for _ in range(rounds) for k in KEYS]
    )


def _run(
    spark: SparkSession,
    endpoints: Endpoints,
    topic: str,
    checkpoint: Location,
    table: str,
    sink_id: str,
) -> None:
    """The counting query, 40 records a batch, run to the end of its input; raises if it
    fails."""
    counts = (
        spark.readStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "40")
        .options(**BOUNDED)
        .load()
        .selectExpr("CAST(key AS STRING) AS word")
        .groupBy("word")
        .count()
    )
    writer = (
        counts.writeStream.format("eos_postgres")
        .outputMode("complete")
        .option("dsn", endpoints.postgres_dsn)
        .option("table", table)
        .option("mode", "upsert")
        .option("keyColumns", "word")
        .option("createTable", "true")
        .option("sinkId", sink_id)
        .option("checkpointLocation", str(checkpoint))
    )
    to_the_end(writer, str(checkpoint), endpoints.kafka_bootstrap, topic)


def _run_processor(
    spark: SparkSession, endpoints: Endpoints, topic: str, checkpoint: Location
) -> None:
    """A transformWithState running count (state variable ``total``), availableNow, into
    the noop sink; raises if it fails."""
    from eos_connectors.dev.harness.pipeline import running_count_processor

    counts = (
        earliest(spark, endpoints, topic)
        .selectExpr("CAST(key AS STRING) AS word")
        .groupBy("word")
        .transformWithStateInPandas(
            running_count_processor(), "word string, count long, delta long", "Update", "None"
        )
    )
    query = (
        counts.writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(300)
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))


def _state_get(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, object]]:
    """``eos state get ... --json``'s rows, without the partition column."""
    capsys.readouterr()
    assert main(["state", "get", *args, "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    return [{k: v for k, v in r.items() if k != "partition_id"} for r in rows]


def _start_check_markers() -> set[Path]:
    return set((Path(tempfile.gettempdir()) / f"eos-start-checks-{os.getuid()}").glob("*"))


def _table(endpoints: Endpoints, table: str) -> dict[str, int]:
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        return dict(conn.execute(f"SELECT word, count FROM {table}").fetchall())


def _sinks(endpoints: Endpoints) -> list[SinkRecord]:
    admin = PostgresSinkAdmin(endpoints.postgres_dsn, "eos")
    try:
        return admin.records()
    finally:
        admin.close()


@pytest.mark.cost(40)
@pytest.mark.parametrize(
    "base",
    [pytest.param("hdfs", marks=[pytest.mark.hdfs, pytest.mark.soak]), pytest.param("local")],
    indirect=True,
)  # CI: on a local disk (~40 s; on HDFS 77-86 s, make soak); a savepoint and a fork on
# HDFS: test_state_get_reads_a_transform_with_state_variable
def test_inspect_savepoint_fork_and_resume(
    spark: SparkSession,
    endpoints: Endpoints,
    unique: str,
    base: Location,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic, sink_id = f"sp-in-{unique}", f"sp-{unique}"
    table_a, table_b = f"sp_a_{unique}", f"sp_b_{unique}"
    original, root = base / "original", base / "savepoints"
    create_topic(endpoints.kafka, topic, 2)
    _produce(endpoints, topic, 10)
    markers_before = _start_check_markers()
    _run(spark, endpoints, topic, original, table_a, sink_id)
    assert _table(endpoints, table_a) == dict.fromkeys(KEYS, 10)
    # The sink's start checks ran in Spark's Python processes and recorded that they passed,
    # so the later calls of streamWriter (two a batch) skip them.
    assert _start_check_markers() - markers_before, "no start-check marker: checks every batch"

    # Inspect: identity, a clean boundary, offsets with no lag, state per partition, the sink.
    checkpoint = read_checkpoint(original)
    report = inspect(checkpoint, _sinks(endpoints))
    first = checkpoint.last_committed
    assert report["query_id"] == json.loads((original / "metadata").read_text())["id"]
    assert first is not None and first >= 2 and report["clean_boundary"]  # 100 records, 40 a batch
    assert sum(report["sources"][0]["offsets"].values()) == 100
    assert report["sources"][0]["lag"] == {f"{topic}-0": 0, f"{topic}-1": 0}
    (operator,) = report["operators"]
    assert len(operator["partitions"]) == report["shuffle_partitions"]
    assert all(p["latest_version"] == first + 1 for p in operator["partitions"])
    assert report["sinks"] == [
        {
            "store": "postgres",
            "sink_id": sink_id,
            "target": report["sinks"][0]["target"],
            "last_decided_batch": first,
            "ahead_of_checkpoint": False,
            "replanned": False,
            "units_in_doubt": 0,
            "oldest_in_doubt_seconds": None,
        }
    ]
    assert main(["checkpoint", "inspect", str(original)]) == 0
    assert f"Sink {sink_id} in postgres" in capsys.readouterr().out

    # The state itself, read from the checkpoint: each key once, with its count.
    add_key_counts(report, key_counts(spark, checkpoint))
    assert report["operators"][0]["keys"] == {"": len(KEYS)}
    assert sum(p["keys"][""] for p in report["operators"][0]["partitions"]) == len(KEYS)
    rows = state_rows(read_state(spark, plan_read(checkpoint, None, None)))
    assert {r["word"]: r["count"] for r in rows} == dict.fromkeys(KEYS, 10)

    # A savepoint only at a clean boundary: the last batch's commit set aside, as a crash
    # before Spark wrote it leaves the checkpoint (a rename: a copy of the checkpoint
    # took 6 s on HDFS).
    commit, aside = original / "commits" / str(first), original / f"commit-{first}.aside"
    rename(commit, aside)
    with pytest.raises(CheckpointError, match="not at a clean boundary"):
        create(original, "bad", root)
    rename(aside, commit)
    point = create(original, "before-more", root)
    assert (point.batch, point.query_id, point.linked) == (
        first,
        checkpoint.query_id,
        is_local(base),
    )
    assert [p.name for p in list_savepoints(root)] == ["before-more"]

    # The original goes on past the savepoint.
    _produce(endpoints, topic, 2)
    _run(spark, endpoints, topic, original, table_a, sink_id)
    assert _table(endpoints, table_a) == dict.fromkeys(KEYS, 12)

    # State of one key, now and as the savepoint holds it.
    assert _state_get(capsys, str(original), "--key", "k3") == [{"word": "k3", "count": 12}]
    at_savepoint = _state_get(capsys, "--savepoint", "before-more", "--dir", str(root))
    assert {r["word"]: r["count"] for r in at_savepoint} == dict.fromkeys(KEYS, 10)

    # Resume is refused: the original checkpoint planned batches after the savepoint...
    with pytest.raises(CheckpointError, match=rf"has planned batch {first + 1} since"):
        restore(point, base / "resumed-too-late", "resume", recorded_sinks)
    # ... and, with that checkpoint out of sight, the sink it records decided them.
    rename(original, base / "away")
    with pytest.raises(CheckpointError, match=rf"{sink_id} in postgres \(batch {first + 1}"):
        restore(point, base / "resumed-too-late", "resume", recorded_sinks, quiet_seconds=0)
    rename(base / "away", original)
    recorded = (original / "eos" / "sinks" / f"postgres-{sink_id}.json").read_text()
    assert "eos:" not in recorded and sink_id in recorded, "no credential in the record"

    # Fork into a new table and sink id: state of the savepoint, records after it read again.
    fork = restore(point, base / "fork", "fork")
    assert fork.query_id != checkpoint.query_id and fork.last_committed == first
    _run(spark, endpoints, topic, base / "fork", table_b, f"sp-fork-{unique}")
    assert _table(endpoints, table_b) == dict.fromkeys(KEYS, 12)

    # A fork into the original's explicit sink id is refused by the sink, writing nothing
    # (on local files only: the refusal is the sink's, as for any new checkpoint, and
    # test_postgres_sink_errors shows it in CI; on HDFS the run cost 5 s).
    if is_local(base):
        restore(point, base / "fork-same-sink", "fork")
        with pytest.raises(Exception, match=rf"(?s){sink_id}.*belongs to query"):
            _run(spark, endpoints, topic, base / "fork-same-sink", table_a, sink_id)
        assert _table(endpoints, table_a) == dict.fromkeys(KEYS, 12)

    # Resume at the last batch: same query id, the original retired, the sink carries on.
    latest = create(original, "latest", root)
    with pytest.raises(CheckpointError, match=r"decided a batch \d+ s ago, so the query looks"):
        restore(find(root, "latest"), base / "resumed", "resume", recorded_sinks)
    resumed = restore(
        find(root, "latest"), base / "resumed", "resume", recorded_sinks, quiet_seconds=0
    )
    assert resumed.query_id == checkpoint.query_id and resumed.last_committed == latest.batch
    assert not original.exists()
    (retired,) = children(base, "original.retired-*")
    assert "Do not start a query on it" in (retired / "RETIRED.txt").read_text()
    _produce(endpoints, topic, 1)
    _run(spark, endpoints, topic, base / "resumed", table_a, sink_id)
    assert _table(endpoints, table_a) == dict.fromkeys(KEYS, 13)

    # Rescale the resumed query's state to another partition count, then carry on (PySpark
    # 4.2+: 4.0-4.1 refuse it, test_operator_actions.py).
    if spark_api.SPARK_MINOR < (4, 2):
        return
    before = read_checkpoint(base / "resumed")
    assert before.shuffle_partitions is not None
    target = 2 if before.shuffle_partitions != 2 else 3
    kept = rescale(spark, base / "resumed", target, root)
    assert kept is not None and kept.name.startswith("before-rescale-")
    assert kept.batch == before.last_committed
    after = read_checkpoint(base / "resumed")
    assert after.shuffle_partitions == target and after.clean
    assert [op.current_partitions for op in after.operators] == [target]
    with pytest.raises(CheckpointError, match=f"already has {target} state partitions"):
        rescale(spark, base / "resumed", target, root)
    _produce(endpoints, topic, 1)
    _run(spark, endpoints, topic, base / "resumed", table_a, sink_id)
    assert _table(endpoints, table_a) == dict.fromkeys(KEYS, 14)


@pytest.mark.cost(16)
@pytest.mark.parametrize(
    "base",
    [pytest.param("hdfs", marks=pytest.mark.hdfs), pytest.param("local", marks=pytest.mark.soak)],
    indirect=True,
)  # the same on either storage; CI on HDFS, make soak both
def test_state_get_reads_a_transform_with_state_variable(
    spark: SparkSession,
    endpoints: Endpoints,
    unique: str,
    base: Location,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """transformWithState keeps one column family per state variable: `state get` finds
    the variable's name in the operator's metadata and reads it. A savepoint taken on the
    same storage and restored as a fork holds that state (HDFS copies, a local disk links:
    the whole savepoint lifecycle is test_inspect_savepoint_fork_and_resume's)."""
    topic, checkpoint = f"sp-tws-{unique}", base / "tws"
    create_topic(endpoints.kafka, topic, 2)
    _produce(endpoints, topic, 3)
    _run_processor(spark, endpoints, topic, checkpoint)

    rows = _state_get(capsys, str(checkpoint))  # the one variable, without --var
    assert {r["word"]: r["total"] for r in rows} == dict.fromkeys(KEYS, 3)
    assert main(["checkpoint", "inspect", str(checkpoint), "--keys", "--json"]) == 0
    (operator,) = json.loads(capsys.readouterr().out)["operators"]
    assert operator["name"] == "transformWithStateInPandasExec"
    assert operator["keys"] == {"total": len(KEYS)}
    assert main(["state", "get", str(checkpoint), "--var", "count"]) == 2
    assert "keeps state variables total: --var count is not one of them" in capsys.readouterr().err

    root = base / "savepoints"
    point = create(checkpoint, "tws", root)
    assert [p.name for p in list_savepoints(root)] == ["tws"] and point.linked == is_local(base)
    fork = restore(point, base / "fork", "fork")
    assert fork.last_committed == point.batch
    forked = _state_get(capsys, str(base / "fork"))
    assert {r["word"]: r["total"] for r in forked} == dict.fromkeys(KEYS, 3)


def _rescale_killed_midway(checkpoint: Location, partitions: int, root: Location) -> bool:
    """``eos checkpoint rescale`` in a process of its own, SIGKILLed (with its JVM) as soon
    as Spark has planned the repartition batch. True when the kill came before that batch
    committed (the case this test is for), False when the rescale had finished."""
    committed = read_checkpoint(checkpoint).last_committed
    assert committed is not None
    planned = checkpoint / "offsets" / str(committed + 1)
    command = [
        sys.executable,
        "-m",
        "eos_connectors.cli",
        "checkpoint",
        "rescale",
        str(checkpoint),
        "--partitions",
        str(partitions),
        "--dir",
        str(root),
    ]
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 180
    while not planned.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert planned.exists(), f"the rescale exited ({process.returncode}) before planning a batch"
    return not read_checkpoint(checkpoint).clean


@pytest.mark.newer_spark
@pytest.mark.cost(9)
@pytest.mark.parametrize(
    "base",
    [pytest.param("hdfs", marks=[pytest.mark.hdfs, pytest.mark.soak]), pytest.param("local")],
    indirect=True,
)  # CI kills rescales on a local disk (the rescale itself runs on HDFS in CI too)
@pytest.mark.parametrize(
    "steps",
    [pytest.param((3,), id="4-3"), pytest.param((8, 2), id="4-8-2", marks=pytest.mark.soak)],
)
@pytest.mark.skipif(
    spark_api.SPARK_MINOR < (4, 2), reason="eos checkpoint rescale needs PySpark 4.2+ (refused)"
)
def test_a_rescale_killed_midway_is_refused_then_finished_exactly(
    spark: SparkSession,
    endpoints: Endpoints,
    unique: str,
    base: Location,
    steps: tuple[int, ...],
) -> None:
    """Each rescale is killed between Spark planning its repartition batch and committing
    it: the query refuses to start on that checkpoint, a rescale to another count is
    refused, the same rescale run again finishes it, and the counts go on exactly."""
    topic, table, sink_id = f"rs-in-{unique}", f"rs_{unique}", f"rs-{unique}"
    checkpoint, root = base / "checkpoint", base / "savepoints"
    create_topic(endpoints.kafka, topic, 2)
    _produce(endpoints, topic, 10)
    _run(spark, endpoints, topic, checkpoint, table, sink_id)
    rounds = 10
    for partitions in steps:
        killed = _rescale_killed_midway(checkpoint, partitions, root)
        print(f"rescale to {partitions}: killed midway {killed}")
        if killed:
            with pytest.raises(Exception, match="STREAMING_UNFINISHED_REPARTITION_DETECTED"):
                _run(spark, endpoints, topic, checkpoint, table, sink_id)
            with pytest.raises(
                CheckpointError,
                match=rf"a rescale to {partitions} partitions "
                rf"was interrupted.*--partitions {partitions} to finish it",
            ):
                rescale(spark, checkpoint, partitions + 1, root)
            assert _table(endpoints, table) == dict.fromkeys(KEYS, rounds)
            point = rescale(spark, checkpoint, partitions, root)
            assert point is not None and point.name.startswith("before-rescale-")
        after = read_checkpoint(checkpoint)
        assert after.clean and after.shuffle_partitions == partitions
        _produce(endpoints, topic, 1)
        rounds += 1
        _run(spark, endpoints, topic, checkpoint, table, sink_id)
        assert _table(endpoints, table) == dict.fromkeys(KEYS, rounds)


@pytest.mark.newer_spark
@pytest.mark.skipif(
    spark_api.SPARK_MINOR < (4, 2),
    reason="PySpark 4.0.5 has no such check (no STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY): "
    "a query starts beside the file; 4.2.1 and 4.3.0 have it, 4.1 was not checked",
)
def test_a_crash_while_writing_the_first_offsets_file_is_cleaned_and_the_query_starts(
    spark: SparkSession,
    endpoints: Endpoints,
    unique: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Spark writes offsets/0 to a hidden temporary file and renames it; a process killed
    in between leaves the temporary file, and a new stateful query then refuses to start
    ("should be empty on batch 0") however often it is restarted. `eos checkpoint inspect`
    shows it and `eos checkpoint clean` removes it; the query then runs exactly."""
    topic, checkpoint = f"sp-tmp-{unique}", tmp_path / "checkpoint"
    create_topic(endpoints.kafka, topic, 2)
    _produce(endpoints, topic, 2)
    left = checkpoint / "offsets" / f".0.{uuid.uuid4()}.tmp"
    left.parent.mkdir(parents=True)
    left.write_text("v1\n")

    with pytest.raises(Exception, match="STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY"):
        _run_processor(spark, endpoints, topic, checkpoint)
    assert main(["checkpoint", "inspect", str(checkpoint)]) == 0
    assert "Unfinished 1 batch write(s)" in capsys.readouterr().out
    assert main(["checkpoint", "clean", str(checkpoint)]) == 0
    assert f"removed {left}" in capsys.readouterr().out and not left.exists()
    _run_processor(spark, endpoints, topic, checkpoint)
    assert {r["word"]: r["total"] for r in _state_get(capsys, str(checkpoint))} == dict.fromkeys(
        KEYS, 2
    )


@pytest.mark.cost(8)
def test_state_in_checkpoint_format_2_is_read_and_rescaled(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Spark's state checkpoint format 2 (``checkpointFormatVersion=2``, not kept with the
    query's settings) names each state file by the attempt that wrote it, and Spark's
    state reader and rewriter read it only in a session set to 2: `inspect` showed no
    version, `state get` failed with FileNotFound on ``1.changelog`` and `rescale` was
    refused. Each now takes the format from the commit log (PySpark 4.1+; 4.0 cannot read
    it, and `state get` says so)."""
    checkpoint = tmp_path / "v2"
    spark.conf.set(STATE_FORMAT, "2")
    try:
        for _ in range(2):  # batches 0 and 1: 140 values, 20 of each key
            (
                spark.readStream.format("rate-micro-batch")
                .option("rowsPerBatch", 70)
                .option("numPartitions", 2)
                .load()
                .selectExpr("value % 7 AS k")
                .groupBy("k")
                .count()
                .writeStream.format("noop")
                .outputMode("update")
                .option("checkpointLocation", str(checkpoint))
                .trigger(once=True)
                .start()
                .awaitTermination(120)
            )
    finally:
        spark.conf.unset(STATE_FORMAT)
    found = read_checkpoint(str(checkpoint))
    assert found.state_format == 2
    assert {p.latest_version for p in found.operators[0].partitions} == {2}

    if spark_api.SPARK_MINOR < (4, 1):
        assert main(["state", "get", str(checkpoint)]) == 2
        assert "reads from PySpark 4.1" in capsys.readouterr().err
        return
    expected = [{"k": k, "count": 20} for k in range(7)]
    assert [{"k": r["k"], "count": r["count"]} for r in _state_get(capsys, str(checkpoint))] == (
        expected
    )
    assert spark.conf.get(STATE_FORMAT, None) is None, "the session's own setting is back"
    if spark_api.SPARK_MINOR >= (4, 2):
        rescale(spark, str(checkpoint), 3, tmp_path / "savepoints")
        rows = _state_get(capsys, str(checkpoint))
        assert [{"k": r["k"], "count": r["count"]} for r in rows] == expected
