"""eos_postgres through crashes: the table equals the result computed from the input.

Pipeline (its own process): eos_kafka -> keyed count (groupBy().count() or a
transformWithStateInPandas processor) -> eos_postgres upsert. Each fault point
of the protocol is hit in three different batches, then the query runs to the
end; random SIGKILLs likewise. After each test no prepared transaction remains.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from connectors.endpoints import Endpoints
from connectors.harness.data import create_topic, produce_words
from tests.pipeline_util import (
    env,
    fault_env,
    kill_when,
    pipeline_command,
    progress_after,
    run,
)

pytestmark = [pytest.mark.services, pytest.mark.spark]

RECORDS = 2500  # with 500 offsets per batch: about six batches


@pytest.fixture
def no_prepared_left(endpoints: Endpoints) -> object:
    """Fail the test if it leaves a prepared transaction of any eos sink behind."""
    yield None
    assert _prepared(endpoints) == [], "prepared transactions left behind"


def _prepared(endpoints: Endpoints) -> list[str]:
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'eos|%'").fetchall()
    return [str(r[0]) for r in rows]


def _table(endpoints: Endpoints, table: str) -> dict[str, int]:
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(sql.SQL("SELECT word, count FROM {}").format(sql.Identifier(table)))
        return {str(word): int(count) for word, count in rows.fetchall()}


def _setup(endpoints: Endpoints, unique: str) -> tuple[str, Counter[str]]:
    topic = f"pg-{unique}"
    create_topic(endpoints.kafka_bootstrap, topic, partitions=3)
    return topic, produce_words(endpoints.kafka_bootstrap, topic, RECORDS, seed=len(unique))


def _command(topic: str, tmp_path: Path, table: str, state: str, trigger: str) -> list[str]:
    return pipeline_command(
        "--topic", topic, "--checkpoint", str(tmp_path / "checkpoint"), "--sink", "postgres",
        "--table", table, "--state", state, "--trigger", trigger,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("point", "state"),
    [
        ("after-prepare", "count"),
        ("after-decision", "processor"),
        ("between-commits", "count"),
        ("after-commit", "processor"),
        ("source-read", "count"),
    ],
)
def test_crash_at_each_fault_point_three_times(
    endpoints: Endpoints, unique: str, tmp_path: Path, no_prepared_left: object,
    point: str, state: str,
) -> None:  # fmt: skip
    topic, expected = _setup(endpoints, unique)
    table = f"counts_{unique}"
    command = _command(topic, tmp_path, table, state, "available-now")
    for crash, batch in enumerate((1, 2, 4)):
        marker = tmp_path / f"fired-{crash}"
        code = run(command, fault_env(point, batch, marker))
        assert marker.exists(), f"fault {point}@{batch} did not fire (exit {code})"
        assert code != 0
    assert run(command, env()) == 0
    assert _table(endpoints, table) == dict(expected)


def test_random_kills_three_times(
    endpoints: Endpoints, unique: str, tmp_path: Path, no_prepared_left: object
) -> None:
    topic, expected = _setup(endpoints, unique)
    table = f"counts_{unique}"
    command = _command(topic, tmp_path, table, "processor", "continuous")
    checkpoint = tmp_path / "checkpoint"
    rng = random.Random(unique)
    for _ in range(3):
        kill_when(command, env(), progress_after(checkpoint), rng.uniform(0, 2))
    assert run(_command(topic, tmp_path, table, "processor", "available-now"), env()) == 0
    assert _table(endpoints, table) == dict(expected)


def test_a_task_retried_after_prepare_neither_blocks_nor_duplicates(
    endpoints: Endpoints, unique: str, tmp_path: Path, no_prepared_left: object
) -> None:
    # Only the Python worker dies after PREPARE; Spark retries the task, whose new
    # attempt rolls back the old prepared transaction (its row locks) and redoes it.
    topic, expected = _setup(endpoints, unique)
    table = f"counts_{unique}"
    marker = tmp_path / "fired"
    command = _command(topic, tmp_path, table, "count", "available-now")
    assert run(command, fault_env("after-prepare", 2, marker, scope="process"), timeout=300) == 0
    assert marker.exists()
    assert _table(endpoints, table) == dict(expected)


def test_append_mode_writes_every_record_once_through_crashes(
    endpoints: Endpoints, unique: str, tmp_path: Path, no_prepared_left: object
) -> None:
    topic, _ = _setup(endpoints, unique)
    table = f"records_{unique}"
    command = _command(topic, tmp_path, table, "none", "available-now")
    for crash, (point, batch) in enumerate([("between-commits", 1), ("after-decision", 3)]):
        run(command, fault_env(point, batch, tmp_path / f"fired-{crash}"))
    assert run(command, env()) == 0
    with psycopg.connect(endpoints.postgres_dsn) as conn:
        rows = conn.execute(
            sql.SQL('SELECT partition, "offset" FROM {}').format(sql.Identifier(table))
        ).fetchall()
    from sources.kafka.broker import BrokerView
    from sources.kafka.options import parse_options
    from tests.kafka_util import read_plain

    view = BrokerView(
        parse_options({"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "subscribe": topic})
    )
    ends = view.latest(view.partitions())
    plain = read_plain(endpoints.kafka_bootstrap, topic, {p: (0, o) for (_, p), o in ends.items()})
    assert len(rows) == len(set(rows)), "a record's row was written twice"
    assert sorted(rows) == sorted((r.partition, r.offset) for r in plain)
