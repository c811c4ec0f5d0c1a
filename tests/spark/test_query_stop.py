"""A query stopped mid-batch (``query.stop()``) leaves nothing in doubt (issue 54, item 8).

The batch has two tasks, one per input partition. Partition 0's task prepares its unit
(a PostgreSQL prepared transaction, holding the table's locks); partition 1's task is
still computing its rows (a UDF that sleeps there) when the query is stopped, right
after the prepare: Spark's abort got no task's message (the one that prepared had not
reported yet), and the sink id is derived from the query id, so the driver reads the
query id from the checkpoint, finds the batch's units by their names and rolls them
back. Before, the unit stayed prepared, holding its locks (``DROP TABLE`` waited)
until the next start or ``eos sinks settle``. The restart writes each record once.

Cost: ~15 s (the query twice; the stopped task's Python worker is killed by Spark).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness.data import produce_words
from eos_connectors.sinks.postgres.options import parse_options
from tests.sink_util import earliest

pytestmark = [pytest.mark.services, pytest.mark.spark]

RECORDS = 200


def _slow_in_partition_1(word: str) -> str:
    """The UDF: partition 1's task sleeps (long past the stop) before its first row."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.partitionId() == 1:
        time.sleep(60)
    return word


def _query(spark: SparkSession, endpoints: Endpoints, topic: str, slow: bool) -> DataFrame:
    words = earliest(spark, endpoints, topic).selectExpr("CAST(value AS STRING) AS word")
    if slow:
        words = words.select(F.udf(_slow_in_partition_1, "string")("word").alias("word"))
    return words


def _start(
    df: DataFrame, endpoints: Endpoints, table: str, checkpoint: Path, **trigger: Any
) -> StreamingQuery:
    return (
        df.writeStream.format("eos_postgres")
        .option("dsn", endpoints.postgres_dsn)
        .option("table", table)
        .option("createTable", "true")
        .option("checkpointLocation", str(checkpoint))
        .trigger(**trigger)
        .start()
    )


def _prepared(endpoints: Endpoints, sink: str) -> list[str]:
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, %s)", (f"eos|{sink}|",)
        )
        return [str(row[0]) for row in rows]


@pytest.mark.cost(15)
def test_a_query_stopped_mid_batch_leaves_no_prepared_transaction(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic, table = f"stop-{unique}", f"stop_{unique}"
    create_topic(endpoints.kafka, topic, 2)
    produce_words(endpoints.kafka_bootstrap, topic, RECORDS)
    checkpoint = tmp_path / "checkpoint"

    slow = _query(spark, endpoints, topic, slow=True)
    query = _start(slow, endpoints, table, checkpoint, processingTime="1 second")
    # Derived from the query id (no sinkId option): when no task reported, the abort reads
    # the query id from the checkpoint to find the sink's units.
    sink = parse_options({"dsn": endpoints.postgres_dsn, "table": table}).sink_id_for(query.id)
    deadline = time.monotonic() + 60
    while not _prepared(endpoints, sink):  # partition 0's task prepared and reported
        assert query.isActive and time.monotonic() < deadline, "no task ever prepared"
        time.sleep(0.2)
    query.stop()
    deadline = time.monotonic() + 10  # the abort runs as the query's thread ends
    while _prepared(endpoints, sink) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _prepared(endpoints, sink) == [], "the stopped batch left a prepared transaction"
    # What DROP TABLE takes. The stopped task's open COPY (it waited for rows) ends when
    # Spark kills its Python worker, a moment after the stop; a prepared unit would hold
    # the lock until the next start.
    with psycopg.connect(endpoints.postgres_dsn) as conn, conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '10s'")
        lock = sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE")
        conn.execute(lock.format(sql.Identifier(table)))
    assert _count(endpoints, table) == 0

    again = _start(
        _query(spark, endpoints, topic, slow=False), endpoints, table, checkpoint, availableNow=True
    )
    again.awaitTermination(120)
    assert _count(endpoints, table) == RECORDS
    assert _prepared(endpoints, sink) == []


def _count(endpoints: Endpoints, table: str) -> int:
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        row = conn.execute(
            sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))
        ).fetchone()
        return int(row[0]) if row else 0
