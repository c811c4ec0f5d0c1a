"""Rows COPYed into the real server come back exactly: binary values (every byte, the
CSV's own delimiters among them, empty and null) into bytea. ~0.1 s."""

from __future__ import annotations

import os

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.postgres.copy import append

pytestmark = pytest.mark.services


def test_binary_values_round_trip_through_copy(endpoints: Endpoints, unique: str) -> None:
    values = [bytes(range(256)), b"", None, b'",\n\\x', os.urandom(1000)]
    batch = pa.RecordBatch.from_pydict(
        {"id": list(range(len(values))), "raw": pa.array(values, pa.binary())}
    )
    table = ("public", f"bytea_{unique}")
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        name = sql.Identifier(*table)
        conn.execute(sql.SQL("CREATE TABLE {} (id int, raw bytea)").format(name))
        try:
            with conn.cursor() as cur:
                assert (
                    append(cur, table, ["id", "raw"], iter([batch.slice(1), batch.slice(0, 1)]))
                    == 5
                )
            rows = conn.execute(sql.SQL("SELECT id, raw FROM {} ORDER BY id").format(name))
            assert [r[1] for r in rows.fetchall()] == values
        finally:
            conn.execute(sql.SQL("DROP TABLE {}").format(name))
