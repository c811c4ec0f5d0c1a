"""PostgreSQL's ``max_prepared_transactions`` reached while a batch's tasks prepare (more
sink tasks a batch than the server allows, as 150 shuffle partitions against the
default-sized 100 did): the task's error names the setting, the server's limit and the
two fixes, where it was psycopg's bare "maximum number of prepared transactions
reached". Cost: well under a second (the limit is filled with prepared transactions of
the test's own, then they are rolled back)."""

from __future__ import annotations

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.protocol import TwoPhaseCommitWriter
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.postgres.exactly_once import PreparedLimitError
from eos_connectors.testing import CONTRACT_SCHEMA
from tests.upsert_util import upsert_source, upserted

pytestmark = pytest.mark.services


def test_the_prepared_transactions_limit_is_named_with_what_to_do(
    endpoints: Endpoints, unique: str
) -> None:
    name = f"limit_{unique}"
    writer = upsert_source("postgres", endpoints, name).streamWriter(CONTRACT_SCHEMA, False)
    assert isinstance(writer, TwoPhaseCommitWriter)
    rows = pa.RecordBatch.from_pydict({"word": ["w"], "n": [1]})
    task = TaskIdentity("limit-query", name, "run", 0, 0, 1)
    fillers: list[str] = []
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        limit = int(conn.execute("SHOW max_prepared_transactions").fetchone()[0])  # type: ignore[index]
        held = int(conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0])  # type: ignore[index]
        try:
            for i in range(limit - held):
                fillers.append(f"filler_{unique}_{i}")
                conn.execute("BEGIN")
                conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(fillers[-1])))
            with pytest.raises(PreparedLimitError, match=rf"currently {limit}\).*coalesce"):
                writer.prepare_task(task, iter([rows]))
        finally:
            for filler in fillers:
                conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(filler)))
    assert upserted("postgres", endpoints, name) == {}
    writer.close()
