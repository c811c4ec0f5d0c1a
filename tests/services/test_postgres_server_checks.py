"""eos_postgres refuses at start a server or a user it cannot write with, naming option
'dsn' and what to do: a standby (a managed service's reader endpoint), sessions
read-only by default, a user without the privileges the mode needs. Each failed before
at the first CREATE or a task's statement with psycopg's bare error. Cost: ~3 s (a
small cluster of its own, as a standby, ~1.7 s)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from eos_connectors.core.errors import ConfigError
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.postgres.connection import connect
from eos_connectors.sinks.postgres.format import PostgresDataSource, check_server
from eos_connectors.sinks.postgres.options import PostgresSinkOptions, parse_options
from eos_connectors.testing import CONTRACT_SCHEMA
from tests.postgres_util import pgbouncer, postgres_server
from tests.upsert_util import ONE_BATCH, write_one_batch

pytestmark = pytest.mark.services


def sink_options(dsn: str, guarantee: str) -> PostgresSinkOptions:
    return parse_options({"dsn": dsn, "table": "t", "deliveryGuarantee": guarantee})


@pytest.fixture
def standby() -> Iterator[str]:
    yield from postgres_server(standby=True)


def test_a_standby_is_refused_naming_dsn(standby: str) -> None:
    with psycopg.connect(standby, autocommit=True) as conn:
        assert conn.execute("SELECT pg_is_in_recovery()").fetchone() == (True,)
        for guarantee in ("exactly-once", "at-least-once"):
            refused = pytest.raises(ConfigError, match=r"'dsn' points at a PostgreSQL standby")
            with refused:
                check_server(conn, sink_options(standby, guarantee))


def test_read_only_sessions_are_refused_naming_dsn(endpoints: Endpoints) -> None:
    read_only = endpoints.postgres_dsn + "?options=-c%20default_transaction_read_only%3Don"
    refused = pytest.raises(ConfigError, match="default_transaction_read_only is on")
    with psycopg.connect(read_only, autocommit=True) as conn, refused:
        check_server(conn, sink_options(read_only, "at-least-once"))
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        check_server(conn, sink_options(endpoints.postgres_dsn, "exactly-once"))


@pytest.fixture
def least_privileged(endpoints: Endpoints, unique: str) -> Iterator[tuple[str, str]]:
    """A role that may only connect, and a table of the administrator's: the DSN of the
    role and the table's name."""
    role, table = f"app_{unique}", f"public.priv_{unique}"
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD 'pw'").format(sql.Identifier(role)))
        admin.execute(
            sql.SQL("CREATE TABLE {} (word text PRIMARY KEY, n bigint)").format(
                sql.Identifier(*table.split("."))
            )
        )
        try:
            yield endpoints.postgres_dsn.replace(_credentials(endpoints), f"{role}:pw"), table
        finally:
            for rollback in admin.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE owner = %s", (role,)
            ).fetchall():
                admin.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(rollback[0])))
            admin.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(*table.split("."))))
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _credentials(endpoints: Endpoints) -> str:
    return endpoints.postgres_dsn.split("//", 1)[1].split("@", 1)[0]


def test_a_least_privileged_user_is_told_each_grant_then_writes_exactly_once(
    endpoints: Endpoints, least_privileged: tuple[str, str], unique: str
) -> None:
    """Each refusal's statements, run as the administrator, are all the user needs: the
    start then passes and a batch prepares and commits. Before, the start failed on
    CREATE SCHEMA IF NOT EXISTS even with the schema made for the user, and a missing
    grant was a task's bare "permission denied". ~0.5 s."""
    dsn, table = least_privileged
    options = {"dsn": dsn, "table": table, "mode": "upsert", "keyColumns": "word"}
    options |= {"bookkeepingSchema": f"books_{unique}", "sinkId": f"priv-{unique}"}
    source = PostgresDataSource(options)
    for expected in ("may not create the bookkeeping schema", "lacks privileges"):
        with pytest.raises(ConfigError, match=expected) as refused:
            source.streamWriter(CONTRACT_SCHEMA, False)
        statements = re.findall(r"(?:CREATE SCHEMA|GRANT) [^;]+;", str(refused.value))
        assert statements, str(refused.value)
        with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as admin:
            for statement in statements:
                admin.execute(statement.encode())
    write_one_batch(source, "priv")
    with psycopg.connect(endpoints.postgres_dsn) as admin:
        found = admin.execute(
            sql.SQL("SELECT word, n FROM {}").format(sql.Identifier(*table.split(".")))
        )
        assert dict(found.fetchall()) == ONE_BATCH
    missing = {**options, "table": f"public.new_{unique}", "createTable": "true"}
    with pytest.raises(ConfigError, match=r"may not create table public.new_\w+ \(option create"):
        PostgresDataSource(missing).streamWriter(CONTRACT_SCHEMA, False)


def test_a_decisions_table_the_user_does_not_own_goes_without_offsets_naming_the_alter(
    endpoints: Endpoints,
    least_privileged: tuple[str, str],
    unique: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An administrator made the bookkeeping tables with an earlier release (no
    ``decisions.offsets`` column) and granted the user their rows. The user's start cannot
    add the column: it warns, naming the ALTER TABLE for the owner, and the sink writes
    as before; the statement, run by the owner, adds it. ~0.5 s."""
    from eos_connectors.sinks.postgres.format import ensure_bookkeeping

    dsn, table = least_privileged
    schema = f"books_{unique}"
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        ensure_bookkeeping(admin, schema)
        admin.execute(sql.SQL("ALTER TABLE {} DROP COLUMN offsets").format(
            sql.Identifier(schema, "decisions")))  # fmt: skip
        role = sql.Identifier(dsn.split("//", 1)[1].split(":", 1)[0])
        for grant in (
            "GRANT USAGE ON SCHEMA {} TO {}",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}",
        ):
            admin.execute(sql.SQL(grant).format(sql.Identifier(schema), role))
        admin.execute(sql.SQL("GRANT INSERT ON {} TO {}").format(
            sql.Identifier(*table.split(".")), role))  # fmt: skip
    options = {"dsn": dsn, "table": table, "bookkeepingSchema": schema, "sinkId": f"o-{unique}"}
    with caplog.at_level("WARNING", logger="eos_connectors.sinks.postgres.format"):
        write_one_batch(PostgresDataSource(options), "old-table")
    alter = re.search(r"ALTER TABLE [^;]+;", caplog.text)
    assert alter is not None, caplog.text
    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as admin:
        found = admin.execute(sql.SQL("SELECT word, n FROM {}").format(
            sql.Identifier(*table.split("."))))  # fmt: skip
        assert dict(found.fetchall()) == ONE_BATCH
        admin.execute(alter.group(0).encode())
        decided = admin.execute(
            sql.SQL("SELECT offsets FROM {}").format(sql.Identifier(schema, "decisions"))
        )
        assert decided.fetchall() == [(None,)]  # the batch decided without it


@pytest.mark.parametrize("pool_mode", ["transaction", "session"])
def test_a_pooler_sharing_sessions_is_refused_and_session_pooling_passes(
    endpoints: Endpoints, pool_mode: str
) -> None:
    """Behind PgBouncer in transaction mode, the first start failed with psycopg's bare
    "prepared statement _pg3_0 already exists"; later, a session lock taken around
    ROLLBACK PREPARED would be left on a server session another client then holds.
    Session mode gives each client its own and passes. ~0.3 s each."""
    for pooled in pgbouncer(endpoints.postgres_dsn, pool_mode):
        with psycopg.connect(pooled, autocommit=True) as conn:
            options = sink_options(pooled, "exactly-once")
            if pool_mode == "session":
                check_server(conn, options)
                continue
            with pytest.raises(ConfigError, match=r"pooler that shares server sessions"):
                check_server(conn, options)


def test_the_sinks_sessions_commit_durably_whatever_the_server_says(
    endpoints: Endpoints,
) -> None:
    """synchronous_commit off (a server's, database's or role's setting for speed) lets
    a crash lose a commit already acknowledged: a decided batch that Spark's checkpoint
    counts as written. The sink's sessions turn it on and keep a stronger setting. ~0.1 s."""
    for given, expected in (("off", "on"), ("remote_apply", "remote_apply"), ("on", "on")):
        dsn = f"{endpoints.postgres_dsn}?options=-c%20synchronous_commit%3D{given}"
        for autocommit in (True, False):
            with connect(sink_options(dsn, "exactly-once"), autocommit) as conn:
                assert conn.execute("SHOW synchronous_commit").fetchone() == (expected,)
