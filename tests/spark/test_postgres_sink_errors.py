"""eos_postgres refuses bad input with clear errors and leaves nothing half-committed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from pyspark.sql import DataFrame, SparkSession

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness.data import produce_words
from tests.postgres_util import postgres_server
from tests.sink_util import earliest

pytestmark = [pytest.mark.services, pytest.mark.spark]


def _words(spark: SparkSession, endpoints: Endpoints, topic: str) -> DataFrame:
    return (
        earliest(spark, endpoints, topic)
        .selectExpr("CAST(key AS STRING) AS word")
        .groupBy("word")
        .count()
    )


def _run(df: DataFrame, checkpoint: Path, **options: str) -> None:
    writer = df.writeStream.format("eos_postgres").outputMode("complete")
    for key, value in {"mode": "upsert", "keyColumns": "word", **options}.items():
        writer = writer.option(key, value)
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination(300)


@pytest.fixture
def topic(endpoints: Endpoints, unique: str) -> str:
    name = f"pgerr-{unique}"
    create_topic(endpoints.kafka, name, 2)
    produce_words(endpoints.kafka_bootstrap, name, 300)
    return name


def _prepared(endpoints: Endpoints) -> set[str]:
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'eos|%'")
        return {str(row[0]) for row in rows}


@pytest.fixture(autouse=True)
def _prepared_before(endpoints: Endpoints) -> Iterator[None]:
    """What other runs on this server left prepared is theirs: a test compares with it."""
    _BEFORE.clear()
    _BEFORE.update(_prepared(endpoints))
    yield


_BEFORE: set[str] = set()


def _nothing_written(endpoints: Endpoints, table: str) -> None:
    assert _prepared(endpoints) - _BEFORE == set(), "this test's sink left units prepared"
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
        if exists and exists[0] is not None:
            count = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
            assert count.fetchone() == (0,)


@pytest.mark.cost(5)
def test_missing_table_without_create(
    spark: SparkSession, endpoints: Endpoints, topic: str, unique: str, tmp_path: Path
) -> None:
    table = f"absent_{unique}"
    with pytest.raises(Exception, match=f"Table {table} does not exist.*createTable=true"):
        _run(_words(spark, endpoints, topic), tmp_path, dsn=endpoints.postgres_dsn, table=table)
    _nothing_written(endpoints, table)


def test_column_type_mismatch(
    spark: SparkSession, endpoints: Endpoints, topic: str, unique: str, tmp_path: Path
) -> None:
    table = f"typed_{unique}"
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (word text PRIMARY KEY, count date)").format(
                sql.Identifier(table)
            )
        )
    with pytest.raises(Exception, match=f"Column 'count' of table {table} is date, which cannot"):
        _run(_words(spark, endpoints, topic), tmp_path, dsn=endpoints.postgres_dsn, table=table)
    _nothing_written(endpoints, table)


def test_upsert_needs_a_unique_key(
    spark: SparkSession, endpoints: Endpoints, topic: str, unique: str, tmp_path: Path
) -> None:
    table = f"nokey_{unique}"
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE TABLE {} (word text, count bigint)").format(sql.Identifier(table))
        )
    with pytest.raises(Exception, match=r"needs a unique index or primary key on exactly \(word\)"):
        _run(_words(spark, endpoints, topic), tmp_path, dsn=endpoints.postgres_dsn, table=table)
    _nothing_written(endpoints, table)


def test_unreachable_server_never_shows_the_password(
    spark: SparkSession, endpoints: Endpoints, topic: str, tmp_path: Path
) -> None:
    dsn = "postgresql://eos:hunter2secret@127.0.0.1:1/eos"
    with pytest.raises(
        Exception, match=r"PostgreSQL at postgresql://eos:\*\*\*@127\.0\.0\.1:1/eos"
    ) as info:
        _run(_words(spark, endpoints, topic), tmp_path, dsn=dsn, table="t")
    assert "hunter2secret" not in str(info.value)


def test_hostile_identifiers_are_quoted(
    spark: SparkSession, endpoints: Endpoints, topic: str, unique: str, tmp_path: Path
) -> None:
    table = f'x"; DROP TABLE victim_{unique}; --'
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE TABLE {} (v int)").format(sql.Identifier(f"victim_{unique}")))
    _run(
        _words(spark, endpoints, topic),
        tmp_path,
        dsn=endpoints.postgres_dsn,
        table=table,
        createTable="true",
    )
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        assert conn.execute("SELECT to_regclass(%s)", (f"victim_{unique}",)).fetchone() != (None,)
        rows = conn.execute(sql.SQL("SELECT sum(count) FROM {}").format(sql.Identifier(table)))
        assert rows.fetchone() == (300,)  # one committed transaction of 300 words


@pytest.fixture
def no_2pc_server() -> Iterator[str]:
    """A second, real PostgreSQL with max_prepared_transactions = 0."""
    yield from postgres_server({"max_prepared_transactions": "0"})


def test_server_without_prepared_transactions_is_refused_at_start(
    spark: SparkSession, endpoints: Endpoints, topic: str, tmp_path: Path, no_2pc_server: str
) -> None:
    with pytest.raises(Exception, match=r"max_prepared_transactions = 0.*at least"):
        _run(
            _words(spark, endpoints, topic),
            tmp_path,
            dsn=no_2pc_server,
            table="t",
            createTable="true",
        )


@pytest.mark.cost(5)
def test_a_new_checkpoint_with_the_same_sink_id_fails_at_its_first_batch(
    spark: SparkSession, endpoints: Endpoints, topic: str, unique: str, tmp_path: Path
) -> None:
    """The user deleted the checkpoint (or started a second query) but kept sinkId: the
    new query's batch 0 must not be skipped as "decided" nor settle the old query's units."""
    table, sink_id = f"pgerr_reuse_{unique}", f"reuse-{unique}"
    options = {
        "dsn": endpoints.postgres_dsn,
        "table": table,
        "createTable": "true",
        "sinkId": sink_id,
    }
    _run(_words(spark, endpoints, topic), tmp_path / "first", **options)
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        before = conn.execute(sql.SQL("SELECT sum(count) FROM {}").format(sql.Identifier(table)))
        assert before.fetchone() == (300,)
    produce_words(endpoints.kafka_bootstrap, topic, 100, seed=7)
    with pytest.raises(Exception, match=rf"Sink '{sink_id}' belongs to query .*sinkId"):
        _run(_words(spark, endpoints, topic), tmp_path / "second", **options)
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        after = conn.execute(sql.SQL("SELECT sum(count) FROM {}").format(sql.Identifier(table)))
        assert after.fetchone() == (300,), "the second query wrote into the first one's sink"
