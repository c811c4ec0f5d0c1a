"""eos_postgres refuses at start a server it cannot write to, naming option 'dsn': a
standby (a managed service's reader endpoint) and sessions read-only by default. Both
failed before at the first CREATE with psycopg's bare "cannot execute CREATE SCHEMA in
a read-only transaction". Cost: ~1.5 s (a small cluster of its own, as a standby)."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from eos_connectors.core.errors import ConfigError
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.sinks.postgres.format import check_server
from eos_connectors.sinks.postgres.options import PostgresSinkOptions, parse_options
from tests.postgres_util import postgres_server

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
