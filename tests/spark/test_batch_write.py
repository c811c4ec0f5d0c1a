"""``df.write.format(...)`` into the three sinks against the real services: a batch job
is batch ``txnVersion`` of job ``sinkId`` in the streaming protocol, so a job killed at
any point of it and run again writes each record once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import redis
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession

from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from tests.kafka_sink_util import read_written
from tests.pipeline_util import ROOT

pytestmark = [pytest.mark.services, pytest.mark.spark]

RECORDS = 400
KEYS = 20


def _produce_input(bootstrap: str, topic: str) -> None:
    """``RECORDS`` records ``r<i>`` keyed ``k<i mod KEYS>`` over two partitions."""
    create_topic(plaintext(bootstrap), topic, partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(topic, value=f"r{i}".encode(), key=f"k{i % KEYS}".encode())
    producer.flush(30)


def _expected_counts() -> Counter[str]:
    return Counter(f"k{i % KEYS}" for i in range(RECORDS))


def _kafka_values(bootstrap: str, topic: str) -> Counter[bytes]:
    return Counter(r.value for r in read_written(plaintext(bootstrap), topic))


def _table_ids(dsn: str, table: str) -> Counter[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f'SELECT id FROM "{table}"').fetchall()
    return Counter(str(r[0]) for r in rows)


def _redis_counts(url: str, prefix: str) -> Counter[str]:
    client = redis.Redis.from_url(url)
    try:
        return Counter(
            {
                key.decode().removeprefix(f"{prefix}:"): int(client.get(key) or 0)
                for key in client.scan_iter(f"{prefix}:*", count=1000)
            }
        )
    finally:
        client.close()


def _save(df: DataFrame, fmt: str, mode: str = "append", **options: str) -> None:
    df.write.format(fmt).options(**options).mode(mode).save()


def _kafka_job(
    spark: SparkSession, endpoints: Endpoints, out: str, unique: str, **options: str
) -> tuple[DataFrame, dict[str, str]]:
    """400 rows ``(k<i>, v<i>)`` and an ``eos_kafka`` job's options (sink ``unique``,
    ``options`` besides) writing them to a new two-partition topic ``out``."""
    df = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(400)], "key string, value string")
    create_topic(endpoints.kafka, out, partitions=2)
    job = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": out, "sinkId": unique}
    return df, {**job, **options}


@pytest.mark.cost(4)
def test_a_job_without_its_identity_or_in_overwrite_mode_is_refused_and_at_least_once_is_not(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    """What versions write, in every sink and shape: the next test."""
    out = f"bver-{unique}"
    create_topic(endpoints.kafka, out, partitions=2)
    df = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(50)], "key string, value string")
    job = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": out, "sinkId": unique}
    with pytest.raises(Exception, match="txnVersion"):
        _save(df, "eos_kafka", **job)
    _save(df, "eos_kafka", deliveryGuarantee="at-least-once", **job)
    _save(df, "eos_kafka", deliveryGuarantee="at-least-once", **job)
    assert sum(_kafka_values(endpoints.kafka_bootstrap, out).values()) == 100
    with pytest.raises(Exception, match="'overwrite' is not supported"):
        _save(df, "eos_kafka", mode="overwrite", txnVersion="9", **job)


def test_a_bad_job_identity_is_refused_before_any_ddl_or_network_call(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    """txnVersion and sinkId are checked first: the table is not created for a write that
    is refused, and an unreachable store is not what the error talks about."""
    df = spark.createDataFrame([("k",)], "key string")
    table = f"bid_{unique}"
    pg = {"dsn": endpoints.postgres_dsn, "table": table, "createTable": "true", "sinkId": unique}
    with pytest.raises(Exception, match="'txnVersion' must be a whole number"):
        _save(df, "eos_postgres", txnVersion="one", **pg)
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        found = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
    assert found == (None,), "the table was created for a refused write"
    nowhere = {"url": "redis://127.0.0.1:1/0", "keyColumn": "key", "valueColumns": "key"}
    with pytest.raises(Exception, match="sinkId' and 'txnVersion' are not set"):
        _save(df, "eos_redis", **nowhere)


def test_versions_above_2_to_the_53_stay_exact_in_redis(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    """Redis's scripts kept the watermark as a Lua number: 2**62 was written back as
    "4.6116860184274e+18", and every later run of the job failed to read it."""
    df = spark.createDataFrame([(f"k{i}", 1) for i in range(5)], "key string, n long")
    prefix = f"big-{unique}"
    job = {
        "url": endpoints.redis_url,
        "keyColumn": "key",
        "valueColumns": "n",
        "mode": "increment",
        "keyPrefix": f"{prefix}:",
        "sinkId": unique,
    }
    for version in (2**62, 2**62 + 1, 2**62, 2**63 - 1):
        df.write.format("eos_redis").options(**job, txnVersion=str(version)).mode("append").save()
    assert _redis_counts(endpoints.redis_url, prefix) == Counter({f"k{i}": 3 for i in range(5)}), (
        "2**62, 2**62 + 1 and 2**63 - 1 once each; 2**62 again wrote nothing"
    )


@pytest.mark.cost(8)
def test_versions_write_once_each_in_any_shape(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    """Versions 6 (two partitions), 4 and 6 again (four partitions) into every sink:
    version 6 once. Issue 52, item 4: on 0.2 the Kafka sink wrote
    version 4's rows of task partitions 2 and 3 and version 6's rows there a second time
    (tasks 0 and 1 found their batch marked; 2 and 3 had no marker). The driver now
    finds both versions at or below a committed one before any task runs."""
    rows = 400
    df = spark.createDataFrame(
        [(f"k{i}", f"v{i}", 1) for i in range(rows)], "key string, value string, n long"
    )
    out, table, prefix = f"bshape-{unique}", f"bshape_{unique}", f"bshape-{unique}"
    create_topic(endpoints.kafka, out, partitions=2)
    sinks = {
        "eos_kafka": {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": out},
        "eos_postgres": {"dsn": endpoints.postgres_dsn, "table": table, "createTable": "true"},
        "eos_redis": {
            "url": endpoints.redis_url,
            "keyColumn": "key",
            "valueColumns": "n",
            "mode": "increment",
            "keyPrefix": f"{prefix}:",
        },
    }
    for version, partitions in (("6", 2), ("4", 4), ("6", 4)):
        shaped = df.repartition(partitions)
        for fmt, options in sinks.items():
            frame = shaped.select("key", "n" if fmt == "eos_redis" else "value")
            job = {"txnVersion": version, "sinkId": f"{unique}-{fmt}"}
            frame.write.format(fmt).options(**options, **job).mode("append").save()
    once = Counter({f"v{i}".encode(): 1 for i in range(rows)})
    assert _kafka_values(endpoints.kafka_bootstrap, out) == once, "version 6 once"
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        written = conn.execute(f'SELECT value, count(*) FROM "{table}" GROUP BY value').fetchall()
    assert dict(written) == {f"v{i}": 1 for i in range(rows)}
    assert _redis_counts(endpoints.redis_url, prefix) == Counter({f"k{i}": 1 for i in range(rows)})


def _fails_in_task_partition_1(value: str) -> str:
    """A UDF that fails every attempt of task partition 1 (the first after a second, so
    that task partition 0 has committed by then)."""
    import time

    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.partitionId() == 1:
        if context.attemptNumber() == 0:
            time.sleep(1)
        raise ValueError("this task partition always fails")
    return value


@pytest.mark.cost(8)
def test_a_partly_written_kafka_version_is_rerun_only_in_its_first_shape(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    """Task-commit mode: version 7 fails with task partition 0 committed. The next version
    is refused until 7 is rerun, a rerun of 7 in one partition is refused (it would leave
    the rows of the first run's partition 1 unwritten), the rerun in two partitions
    writes the rest, and a rerun of 7 after that, in four, writes nothing."""
    from pyspark.sql.functions import udf

    rows = 400
    out = f"bpart-{unique}"
    df, job = _kafka_job(spark, endpoints, out, unique, commitMode="task")
    failing = udf(_fails_in_task_partition_1, "string")
    with pytest.raises(Exception, match="always fails"):
        _save(
            df.repartition(2).select("key", failing("value").alias("value")),
            "eos_kafka",
            txnVersion="7",
            **job,
        )
    first = _kafka_values(endpoints.kafka_bootstrap, out)
    assert 0 < sum(first.values()) < rows and max(first.values()) == 1, "task partition 0 only"

    with pytest.raises(Exception, match=r"txnVersion 7 of job .* was partly written"):
        _save(df, "eos_kafka", txnVersion="8", **job)
    with pytest.raises(Exception, match=r"repartition\(2\)"):
        _save(df.repartition(1), "eos_kafka", txnVersion="7", **job)
    assert _kafka_values(endpoints.kafka_bootstrap, out) == first, "the refusals wrote nothing"

    _save(df.repartition(2), "eos_kafka", txnVersion="7", **job)
    once = Counter({f"v{i}".encode(): 1 for i in range(rows)})
    assert _kafka_values(endpoints.kafka_bootstrap, out) == once
    _save(df.repartition(4), "eos_kafka", txnVersion="7", **job)
    _save(df.repartition(3), "eos_kafka", txnVersion="5", **job)
    assert _kafka_values(endpoints.kafka_bootstrap, out) == once


@pytest.mark.cost(7)
def test_a_batch_commit_version_is_rerun_in_any_shape(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    """``commitMode=batch``: version 7 fails in task partition 1 after partition 0 wrote,
    and nothing of it is visible. Its rerun in three partitions with a ``rand()`` column
    writes each record once; a rerun of 7 in four partitions and version 5 then write
    nothing (the refusals of the task-commit mode above do not apply)."""
    from pyspark.sql import functions as F

    rows = 400
    out = f"bbc-{unique}"
    df, job = _kafka_job(spark, endpoints, out, unique, commitMode="batch")
    failing = F.udf(_fails_in_task_partition_1, "string")
    with pytest.raises(Exception, match="always fails"):
        _save(
            df.repartition(2).select("key", failing("value").alias("value")),
            "eos_kafka",
            txnVersion="7",
            **job,
        )
    assert _kafka_values(endpoints.kafka_bootstrap, out) == Counter(), "visible undecided"

    def written() -> Counter[bytes]:
        values = _kafka_values(endpoints.kafka_bootstrap, out)
        return Counter(v.split(b"|")[0] for v in values.elements())

    noisy = F.concat(F.col("value"), F.lit("|"), F.rand().cast("string"))
    _save(df.repartition(3).select("key", noisy.alias("value")), "eos_kafka", txnVersion="7", **job)
    once = Counter({f"v{i}".encode(): 1 for i in range(rows)})
    assert written() == once
    _save(df.repartition(4), "eos_kafka", txnVersion="7", **job)
    _save(df, "eos_kafka", txnVersion="5", **job)
    assert written() == once


def _held_until(path: str) -> Callable[[str], str]:
    """A UDF that holds each row until the file ``path`` exists (at most 180 s)."""

    def held(value: str) -> str:
        import os
        import time

        deadline = time.time() + 180
        while not os.path.exists(path) and time.time() < deadline:
            time.sleep(0.05)
        return value

    return held


def _claimed(endpoints: Endpoints, job: dict[str, str], after: int = -1) -> int:
    """Once a run of ``job`` claimed its version after epoch ``after`` of the decider (-1:
    it has a producer id at all): the decider's epoch."""
    from kafka.errors import KafkaError, TransactionalIdNotFoundError

    from eos_connectors.sinks.kafka.coordinator import TransactionClient
    from eos_connectors.sinks.kafka.decisions import decision_group
    from eos_connectors.sinks.kafka.options import parse_options
    from tests.source_util import wait_for

    options = parse_options({k: v for k, v in job.items() if k != "txnVersion"})
    name = decision_group(options, job["sinkId"])
    client = TransactionClient(endpoints.kafka)

    def epoch() -> int:
        try:
            return int(getattr(client.describe([name]).get(name), "producer_epoch", -1))
        except TransactionalIdNotFoundError:
            return -1
        except KafkaError as exc:  # a new broker's coordinator not up yet: ask again
            if not exc.retriable:
                raise
            return -1

    try:
        wait_for(lambda: epoch() > after, "a run's claim", epoch, 120)
        return epoch()
    finally:
        client.close()


@pytest.mark.cost(25)
def test_two_runs_of_a_batch_commit_version_at_once_write_it_once(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """A scheduler's retry while the first attempt still runs: run A of version 9 (its own
    Spark application, one task) and, once A's driver claimed the version, run B in this
    one (two tasks, another split, other ``rand()`` values). A comes to decide after B
    claimed the version and before B decides (sinks/kafka/runs.py): A fails saying another
    run started after it, with nothing of it visible, and B writes every record once.
    (Had B decided first, A's commit would find the version decided and end B's
    transactions again, as any rerun does.)"""
    import json
    import os
    import subprocess
    import sys
    import threading

    from pyspark.sql import functions as F

    rows = 400
    out = f"bruns-{unique}"
    df, job = _kafka_job(spark, endpoints, out, unique, commitMode="batch", txnVersion="9")
    # The order is held by files, not by timing: A's task waits for `b_claimed`, B's tasks
    # for `a_ended` (A said how its write ended). Timing alone failed on loaded CI
    # machines: B claimed after A decided (ci99); B decided before A (ci100, and most
    # likely at stop 87, where B's ~10 s tasks had to outlast A's ~6 s one).
    b_claimed, a_ended = tmp_path / "b-claimed", tmp_path / "a-ended"
    command = [sys.executable, "-m", "tests.pipelines.version_run", "--options", json.dumps(job)]
    command += ["--wait-for", str(b_claimed), "--row-ms", "0"]
    errors = tmp_path / "run-a.err"
    with errors.open("w") as stderr:
        run_a = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**os.environ, "SPARK_LOCAL_DIRS": str(tmp_path)},
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    said: list[str] = []
    try:
        a_claim = _claimed(endpoints, job)  # A's driver claimed the version: B starts after

        failures: list[BaseException] = []

        def run_a_to_its_end() -> None:
            try:
                _claimed(endpoints, job, after=a_claim)  # B's driver claimed it too
                b_claimed.touch()
                assert run_a.stdout is not None
                for line in run_a.stdout:  # RUN-FAILED or RUN-WROTE: A decided, or failed to
                    said.append(line)
                    if line.startswith("RUN-"):
                        a_ended.touch()
                run_a.wait(timeout=60)
            except BaseException as exc:  # raised below, once B's write has ended
                failures.append(exc)
            finally:
                a_ended.touch()  # B's tasks go on however A's watch ended

        watcher = threading.Thread(target=run_a_to_its_end, daemon=True)
        watcher.start()
        noisy = F.concat(F.col("value"), F.lit("|"), F.rand().cast("string"))
        held = F.udf(_held_until(str(a_ended)), "string")
        _save(df.repartition(2).select("key", held(noisy).alias("value")), "eos_kafka", **job)
        watcher.join(timeout=200)
        if failures:
            raise failures[0]
    finally:
        run_a.kill()
        run_a.wait(timeout=30)
    output = "".join(said)[-2000:]
    assert run_a.returncode == 3, f"run A did not fail: {output} {errors.read_text()[-2000:]}"
    assert "started after this one" in output, output
    values = _kafka_values(endpoints.kafka_bootstrap, out)
    written = Counter(v.split(b"|")[0] for v in values.elements())
    assert written == Counter({f"v{i}".encode(): 1 for i in range(rows)})


@pytest.mark.cost(9)
def test_foreach_batch_into_two_sinks_writes_each_batch_once_into_each_after_a_crash_between(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """docs/batch-writes.md's recipe: one stream into ``eos_kafka`` and ``eos_postgres``
    from ``foreachBatch``, ``txnVersion`` the batch id. A run that fails between the two
    writes of batch 1 leaves it in Kafka only; its replay writes nothing to Kafka and
    the batch to PostgreSQL, so each holds each row once."""
    topic, table = f"feb-{unique}", f"feb_{unique}"
    create_topic(endpoints.kafka, topic, partitions=2)
    failed: list[int] = []

    def write(df: DataFrame, batch_id: int) -> None:
        rows = df.selectExpr("CAST(value AS STRING) AS key", "CAST(value AS STRING) AS value")
        version = {"sinkId": f"{unique}-k", "txnVersion": str(batch_id)}
        kafka = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": topic}
        _save(rows, "eos_kafka", **kafka, **version)
        if batch_id == 1 and not failed:
            failed.append(batch_id)
            raise RuntimeError("the driver dies between the two writes of batch 1")
        pg = {"dsn": endpoints.postgres_dsn, "table": table, "createTable": "true"}
        _save(
            rows.withColumnRenamed("key", "id"),
            "eos_postgres",
            **pg,
            sinkId=f"{unique}-p",
            txnVersion=str(batch_id),
        )

    for run in range(3):  # batch 0; batch 1, failing; batch 1 again
        query = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", 50)
            .option("numPartitions", 2)
            .load()
            .writeStream.foreachBatch(write)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(once=True)
            .start()
        )
        if run == 1:
            with pytest.raises(Exception, match="between the two writes"):
                query.awaitTermination(120)
        else:
            query.awaitTermination(120)
    expected = Counter(str(i) for i in range(100))
    assert _kafka_values(endpoints.kafka_bootstrap, topic) == Counter(v.encode() for v in expected)
    assert _table_ids(endpoints.postgres_dsn, table) == expected


@pytest.mark.cost(3)
def test_a_quoted_mixed_case_partitioned_table_takes_upserts(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    """``table`` as a JDBC job spells it (``"Sales"."Orders"``: before, the quotes were
    taken as part of one name, "does not exist"), into a partitioned table whose key
    holds the partition column, as PostgreSQL requires of a unique key there."""
    schema = f"Sales_{unique}"
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(
            f'CREATE TABLE "{schema}"."Orders" (id bigint, region text, amount bigint, '
            "PRIMARY KEY (id, region)) PARTITION BY LIST (region)"
        )
        for region in ("eu", "us"):
            conn.execute(
                f'CREATE TABLE "{schema}"."Orders_{region}" PARTITION OF "{schema}"."Orders" '
                f"FOR VALUES IN ('{region}')"
            )
    options = {
        "dsn": endpoints.postgres_dsn,
        "table": f'"{schema}"."Orders"',
        "mode": "upsert",
        "keyColumns": "id,region",
        "sinkId": unique,
    }
    for version in (1, 2):
        rows = spark.range(40).selectExpr(
            "id",
            "CASE WHEN id % 2 = 0 THEN 'eu' ELSE 'us' END AS region",
            f"id * {version} AS amount",
        )
        rows.write.format("eos_postgres").options(**options, txnVersion=str(version)).mode(
            "append"
        ).save()
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        found = conn.execute(f'SELECT count(*), sum(amount) FROM "{schema}"."Orders_eu"').fetchone()
        total = conn.execute(f'SELECT count(*), sum(amount) FROM "{schema}"."Orders"').fetchone()
    assert found == (20, 2 * sum(range(0, 40, 2)))
    assert total == (40, 2 * sum(range(40)))


@pytest.mark.cost(20)
def test_foreach_batch_over_a_checkpoint_restored_from_an_older_copy_is_refused(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """The recipe's writes (``eos_kafka`` and ``eos_postgres``, ``txnVersion`` the batch id)
    from an ``eos_kafka`` stream of 100 records a batch: batches 0-3, a copy of the
    checkpoint, batches 4-5, the copy put back and the stream restarted with larger
    batches. Spark would run batch 4 again over all 300 records since the copy, and each
    write would take it for a rerun and write nothing: 100 lost. The write's tasks see
    the stream's batch id and refuse instead; with the newer checkpoint back the stream
    writes the rest, each record once into each sink. Then the checkpoint is put back by
    exactly its last batch (its ``offsets/`` and ``commits/`` files deleted) with 100 more
    records: that batch is the jobs' last version, so the tasks cannot tell it from a
    replay; the writes' plans refuse it by the source positions their decisions recorded
    (``streamCheckpoint``), and with the files back the stream writes the 100 once."""
    import shutil

    from tests.kafka_util import produce_plain
    from tests.sink_util import BOUNDED, delete_last_batch, put_files_back, to_the_end

    source, out, table = f"febo-in-{unique}", f"febo-out-{unique}", f"febo_{unique}"
    for topic in (source, out):
        create_topic(endpoints.kafka, topic, partitions=2)
    checkpoint, older, newer = tmp_path / "checkpoint", tmp_path / "older", tmp_path / "newer"

    def write(df: DataFrame, batch_id: int) -> None:
        rows = df.selectExpr("CAST(value AS STRING) AS key", "CAST(value AS STRING) AS value")
        version = {"txnVersion": str(batch_id), "streamCheckpoint": str(checkpoint)}
        kafka = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": out}
        _save(rows, "eos_kafka", **kafka, sinkId=f"{unique}-k", **version)
        pg = {"dsn": endpoints.postgres_dsn, "table": table, "createTable": "true"}
        _save(rows.withColumnRenamed("key", "id"), "eos_postgres", **pg, sinkId=f"{unique}-p",
              **version)  # fmt: skip

    def run(max_offsets: int) -> None:
        reader = (
            spark.readStream.format("eos_kafka")
            .option("kafka.bootstrap.servers", endpoints.kafka_bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(max_offsets))
            .options(**BOUNDED)
        )
        writer = reader.load().writeStream.foreachBatch(write)
        to_the_end(writer.option("checkpointLocation", str(checkpoint)), checkpoint.as_posix(),
                   endpoints.kafka_bootstrap, source)  # fmt: skip

    def more(name: str, count: int) -> list[str]:
        values = [f"{unique}-{name}-{i}" for i in range(count)]
        produce_plain(endpoints.kafka_bootstrap, source, [v.encode() for v in values])
        return values

    def written() -> tuple[Counter[bytes], Counter[str]]:
        return _kafka_values(endpoints.kafka_bootstrap, out), _table_ids(
            endpoints.postgres_dsn, table
        )

    def once(values: list[str]) -> tuple[Counter[bytes], Counter[str]]:
        return Counter(v.encode() for v in values), Counter(values)

    first = more("first", 400)
    run(100)
    shutil.copytree(checkpoint, older)
    middle = more("middle", 200)
    run(100)
    shutil.copytree(checkpoint, newer)
    shutil.rmtree(checkpoint)
    shutil.copytree(older, checkpoint)
    after = more("after", 100)
    with pytest.raises(Exception, match=r"runs in foreachBatch for batch \d+ of a stream"):
        run(1000)
    assert written() == once(first + middle), "the refused run wrote something"
    shutil.rmtree(checkpoint)
    shutil.copytree(newer, checkpoint)
    run(100)
    assert written() == once(first + middle + after)

    last, deleted = delete_last_batch(checkpoint)
    later = more("later", 100)
    with pytest.raises(Exception, match=rf"runs for batch {last} .* other source positions"):
        run(1000)
    assert written() == once(first + middle + after), "the refused run wrote something"
    put_files_back(checkpoint, deleted)
    run(100)
    assert written() == once(first + middle + after + later)
