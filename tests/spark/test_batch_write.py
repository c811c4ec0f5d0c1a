"""``df.write.format(...)`` into the three sinks against the real services: a batch job
is batch ``txnVersion`` of job ``sinkId`` in the streaming protocol, so a job killed at
any point of it and run again writes each record once."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import psycopg
import pytest
import redis
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession

from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints
from tests.pipeline_util import env, run

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
    return Counter(r.value for r in read_to_end(plaintext(bootstrap), topic))


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


def test_a_batch_job_killed_at_every_point_and_rerun_writes_each_record_once(
    endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    """Every fault point of every sink crossed once, each a kill: of a task or of the
    commit (the job fails and is run again, as a scheduler's retry would), or of the
    whole driver between PostgreSQL's and Redis's decision and their commits (the test
    runs the job again, with the same ``txnVersion``, in a new Spark application)."""
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
        f"after-decision:{postgres}=group",
        *(f"{p}:{postgres}" for p in ("between-commits", "after-commit")),
        *(f"{p}:{rds}" for p in ("before-prepare", "mid-prepare", "after-prepare")),
        f"after-decision:{rds}=group",
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
    codes = [run(command, faults, timeout=300) for _ in range(3)]
    assert codes == [-9, -9, 0], f"exit codes {codes}"
    fired = sorted(p.name for p in markers.iterdir())
    assert len(fired) == len(entries), f"points that never fired: {entries} vs {fired}"

    inputs = Counter(f"r{i}".encode() for i in range(RECORDS))
    assert _kafka_values(endpoints.kafka_bootstrap, out) == inputs
    assert _table_ids(endpoints.postgres_dsn, table) == Counter(v.decode() for v in inputs)
    assert _redis_counts(endpoints.redis_url, prefix) == _expected_counts()

    # The same version once more, with no faults: every sink writes nothing.
    assert run(command, env(), timeout=300) == 0
    assert _kafka_values(endpoints.kafka_bootstrap, out) == inputs
    assert sum(_table_ids(endpoints.postgres_dsn, table).values()) == RECORDS
    assert _redis_counts(endpoints.redis_url, prefix) == _expected_counts()


def _save(df: DataFrame, fmt: str, mode: str = "append", **options: str) -> None:
    df.write.format(fmt).options(**options).mode(mode).save()


def test_versions_write_once_each_and_a_version_used_again_writes_nothing(
    spark: SparkSession, endpoints: Endpoints, unique: str
) -> None:
    out = f"bver-{unique}"
    create_topic(endpoints.kafka, out, partitions=2)
    df = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(50)], "key string, value string")
    job = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": out, "sinkId": unique}
    table = f"bver_{unique}"
    pg = {"dsn": endpoints.postgres_dsn, "table": table, "createTable": "true", "sinkId": unique}
    for version in ("5", "5", "6", "4"):
        _save(df, "eos_kafka", txnVersion=version, **job)
        _save(df.select("key"), "eos_postgres", txnVersion=version, **pg)
    values = _kafka_values(endpoints.kafka_bootstrap, out)
    assert values == Counter({f"v{i}".encode(): 2 for i in range(50)}), "versions 5 and 6 only"
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(f'SELECT key, count(*) FROM "{table}" GROUP BY key').fetchall()
    assert dict(rows) == {f"k{i}": 2 for i in range(50)}, "versions 5 and 6 only"

    with pytest.raises(Exception, match="txnVersion"):
        _save(df, "eos_kafka", **{**job, "sinkId": f"{unique}-b"})
    _save(df, "eos_kafka", deliveryGuarantee="at-least-once", **job)
    assert sum(_kafka_values(endpoints.kafka_bootstrap, out).values()) == 150
    with pytest.raises(Exception, match="'overwrite' is not supported"):
        _save(df, "eos_kafka", mode="overwrite", txnVersion="9", **job)
