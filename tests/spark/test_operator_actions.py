"""Exactly once whatever the operator does between a failed batch and its replay.

Each test here is an ordinary operator action that once broke the guarantee
silently: a tuning option changed before a restart, a sink id reused by a new
checkpoint, a resume or a reset while the query could still replay a batch.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from eos_connectors.core import spark_api
from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from tests.kafka_sink_util import read_written
from tests.kafka_util import produce_plain

pytestmark = [pytest.mark.services, pytest.mark.spark]

RECORDS = 2_000
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def _in_session(
    spark: SparkSession,
    endpoints: Endpoints,
    source: str,
    out: str,
    work: Path,
    sink_id: str,
    min_partitions: int,
) -> None:
    """eos_kafka -> eos_kafka to the end of the input, in the session's Spark: these
    queries are never crashed, so they need no process of their own."""
    from tests.pipelines import source_to_kafka

    checkpoint = str(work / "checkpoint")
    source_to_kafka.run(
        spark, endpoints.kafka_bootstrap, source, out, checkpoint, sink_id, str(min_partitions)
    )


def _input(endpoints: Endpoints, unique: str) -> tuple[str, str, list[bytes]]:
    source, out = f"op-in-{unique}", f"op-out-{unique}"
    create_topic(endpoints.kafka, source, partitions=2)
    create_topic(endpoints.kafka, out, partitions=2)
    values = [f"{unique}-{i}".encode() for i in range(RECORDS)]
    for partition in (0, 1):
        produce_plain(endpoints.kafka_bootstrap, source, values[partition::2], partition)
    return source, out, values


@pytest.mark.cost(5)
def test_a_new_checkpoint_that_reuses_a_kafka_sink_id_writes_nothing_anywhere(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """The first query writes through sink id S with 2 tasks a batch; a second query, on a
    new checkpoint with the same S, reads with 4 tasks side by side: it is refused at its
    start by the sink id's claim, which its driver tries to take, so it fails having
    written nothing at all, also on task partitions the first query never wrote. (A
    driver that cannot read its checkpoint leaves the claim to the tasks, which refuse
    the same way: test_of_two_queries_sharing_a_sink_id_only_one_writes.)"""
    source, out, values = _input(endpoints, unique)
    sink_id = f"op-{unique}"
    _in_session(spark, endpoints, source, out, tmp_path / "first", sink_id, 2)
    with pytest.raises(Exception, match=sink_id):  # the second query must fail
        _in_session(spark, endpoints, source, out, tmp_path / "second", sink_id, 4)
    written = Counter(r.value for r in read_written(endpoints.kafka, out))
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


@pytest.mark.cost(8)
def test_resume_and_reset_refuse_while_the_owning_query_can_still_replay_or_runs(
    spark: SparkSession,
    endpoints: Endpoints,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
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
    _in_session(spark, endpoints, source, out, tmp_path, sink_id, 2)
    stale = tmp_path / "stale"
    shutil.copytree(checkpoint, stale)
    produce_plain(endpoints.kafka_bootstrap, source, [b"one-more"], 0)
    _in_session(spark, endpoints, source, out, tmp_path, sink_id, 2)
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
    _in_session(spark, endpoints, source, out, tmp_path / "new", sink_id, 2)  # claims it
    counts = Counter(r.value for r in read_written(endpoints.kafka, out))
    from eos_connectors.core.topics import end_offsets

    assert all(counts[v] == 2 for v in values), (
        "the new query wrote its input once more",
        Counter(counts[v] for v in values),
        end_offsets(endpoints.kafka, out),
        end_offsets(endpoints.kafka, out, "read_uncommitted"),
    )


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
    refusal = (
        r"HDFSBackedStateStoreProvider.*Nothing was changed"
        if spark_api.SPARK_MINOR >= (4, 2)
        else rf"needs PySpark 4\.2 or later.*PySpark {spark_api.release()} has none.*nothing was"
    )  # 4.0-4.1 have no checkpoint manager: every rescale is refused, naming the release
    with pytest.raises(CheckpointError, match=refusal):
        rescale(spark, tmp_path / "checkpoint", 3, root)
    assert list_savepoints(root) == [], "a savepoint was taken before the refusal"


@pytest.mark.cost(12)
@pytest.mark.parametrize("commit_mode", ["batch", "task"])
def test_a_restart_through_another_sink_id_before_the_batch_completes_is_refused(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path, commit_mode: str
) -> None:
    """The query writes through sink id B, then through sink id A, and A's last batch is
    left uncompleted in the checkpoint (the driver died after the sink committed it,
    before Spark wrote ``commits/N``). Restarted with B again, in the same driver that
    started B before (a notebook switching back and forth), Spark would replay the batch
    through B and write it again: the start is refused, naming A and the batch, writing
    nothing. With A again the replay finishes it (A finds it committed); then B takes
    over for the new records. Every input record is in the output once."""
    from tests.kafka_util import uncommit

    source, out, values = _input(endpoints, unique)
    work = tmp_path
    old, new = f"op-{unique}-a", f"op-{unique}-b"

    def run(sink_id: str) -> int:
        """The query through ``sink_id`` to the end of its input; its last batch."""
        from tests.pipelines import source_to_kafka

        checkpoint = str(work / "checkpoint")
        source_to_kafka.run(spark, endpoints.kafka_bootstrap, source, out, checkpoint, sink_id,
                            "2", "500", commit_mode)  # fmt: skip
        return max(int(p.name) for p in (work / "checkpoint" / "commits").glob("[0-9]*"))

    def more(name: str) -> list[bytes]:
        records = [f"{unique}-{name}-{i}".encode() for i in range(100)]
        produce_plain(endpoints.kafka_bootstrap, source, records)
        return records

    before = run(new)
    middle = more("middle")
    last = run(old)
    assert last > before, "the test needs a batch of A's"
    uncommit(work / "checkpoint", last)
    with pytest.raises(Exception, match=rf"sink '{old}' .* decided batch {last},"):
        run(new)
    run(old)
    after = more("after")
    run(new)
    written = Counter(r.value for r in read_written(endpoints.kafka, out))
    assert sum(written.values()) == RECORDS + 200, "written twice or lost"
    assert sorted(written) == sorted(values + middle + after)


@pytest.mark.cost(20)
@pytest.mark.parametrize("commit_mode", ["batch", "task"])
def test_a_checkpoint_restored_from_an_older_copy_is_refused_before_it_skips_anything(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path, commit_mode: str
) -> None:
    """The query writes batches 0-3 (500 records each), a copy of its checkpoint is taken,
    and it goes on to batch 5; the copy is restored and the query restarted with larger
    batches. Spark would plan batch 4 again over all 1,500 records since the copy, which
    the sink would skip as decided (its batch 4 held 500 of them): 500 lost, and every
    later record past them likewise. The restart is refused instead, at batch 4's commit
    (its tasks found it decided, or marked, while the sink decided batch 5), writing
    nothing: this driver started the sink with these options before, so its start checks
    do not run again (a new driver's start refuses: tests/services/test_checkpoint_behind.py).
    With the newer checkpoint back, the query writes the rest. Then the checkpoint's last
    batch is deleted and 300 more records arrive: the replanned batch, the sink's last
    decided (or marked) one, is refused at its commit by the source positions its
    decision (or its task partitions' markers) recorded; with the files back, the 300 are
    written. Every record once."""
    import shutil

    from tests.pipelines import source_to_kafka
    from tests.sink_util import delete_last_batch, put_files_back

    source, out, values = _input(endpoints, unique)
    checkpoint, older, newer = tmp_path / "checkpoint", tmp_path / "older", tmp_path / "newer"

    def run(max_offsets: str) -> None:
        source_to_kafka.run(spark, endpoints.kafka_bootstrap, source, out, str(checkpoint),
                            f"op-{unique}", "2", max_offsets, commit_mode)  # fmt: skip

    def more(name: str, count: int) -> list[bytes]:
        records = [f"{unique}-{name}-{i}".encode() for i in range(count)]
        produce_plain(endpoints.kafka_bootstrap, source, records)
        return records

    def written() -> list[bytes]:
        found = [r.value for r in read_written(endpoints.kafka, out)]
        assert len(found) == len(set(found)), "a record written twice"
        return sorted(found)

    run("500")
    shutil.copytree(checkpoint, older)
    middle = more("middle", 1000)
    run("500")
    shutil.copytree(checkpoint, newer)
    shutil.rmtree(checkpoint)
    shutil.copytree(older, checkpoint)
    after = more("after", 500)
    with pytest.raises(Exception, match=r"batch \d+ of this query was found decided"):
        run("5000")
    assert written() == sorted(values + middle), "the refused run wrote something"
    shutil.rmtree(checkpoint)
    shutil.copytree(newer, checkpoint)
    run("500")
    assert written() == sorted(values + middle + after)

    # Put back by one batch: its last offsets/ and commits/ files deleted, more input. The
    # replanned batch is the sink's last decided (or marked) one; the source positions its
    # decision (or each task partition's marker) recorded tell it from a replay.
    last, deleted = delete_last_batch(checkpoint)
    latest = more("latest", 300)
    with pytest.raises(Exception, match=rf"batch {last} .* other source positions"):
        run("5000")
    assert written() == sorted(values + middle + after), "the refused run wrote something"
    put_files_back(checkpoint, deleted)
    run("500")
    assert written() == sorted(values + middle + after + latest)
