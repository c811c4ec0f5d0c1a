"""A PostgreSQL sink's table dropped, or a column of it dropped, after the query's start
check: the task's error says which and what to do, where it was psycopg's bare
"relation ... does not exist". Cost: well under a second."""

from __future__ import annotations

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.postgres.options import parse_options
from eos_connectors.sinks.postgres.rows import TableChangedError, TaskRows

pytestmark = pytest.mark.services


@pytest.mark.parametrize(
    ("mode", "change", "said"),
    [
        ("append", "DROP TABLE {}", r"\(option table\) no longer exists: it was dropped"),
        ("upsert", "DROP TABLE {}", r"\(option table\) no longer exists: it was dropped"),
        ("upsert", "ALTER TABLE {} DROP COLUMN v", r'lost a column .*column "v"'),
    ],
)
def test_a_table_changed_under_a_running_sink_is_named(
    endpoints: Endpoints, unique: str, mode: str, change: str, said: str
) -> None:
    table = f"changed_{unique}"
    keyed = {"keyColumns": "k"} if mode == "upsert" else {}
    options = parse_options({"dsn": endpoints.postgres_dsn, "table": table, "mode": mode, **keyed})
    name = sql.Identifier(table)
    rows = pa.RecordBatch.from_arrays([pa.array(["a", "b"]), pa.array([1, 2])], ["k", "v"])
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE TABLE {} (k text PRIMARY KEY, v bigint)").format(name))
        admin.execute(sql.SQL(change).format(name))
        with (
            psycopg.connect(endpoints.postgres_dsn) as conn,
            conn.cursor() as cur,
            pytest.raises(TableChangedError, match=said),
        ):
            TaskRows(options, ("k", "v"), ()).write(cur, "unit-1", iter([rows]))
        admin.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(name))
