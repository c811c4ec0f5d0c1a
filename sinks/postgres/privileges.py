"""What the sink's PostgreSQL user must be allowed to do, checked by the driver at a
query's start, so that a missing grant fails there, naming each privilege with the
``GRANT`` that gives it, and never as a task's bare "permission denied" mid-batch.

The sink needs, besides ``CONNECT``:

* the bookkeeping schema: ``USAGE``; ``CREATE`` for upsert and update (each task's
  stage table lives there) and to create a missing bookkeeping table;
* the bookkeeping tables (exactly-once): ``SELECT, INSERT, UPDATE, DELETE``;
* the target table: ``INSERT`` (append); ``SELECT, INSERT, UPDATE`` (upsert);
  ``SELECT, UPDATE`` (update); ``DELETE`` besides for a change stream's deletes;
* ``TEMPORARY`` on the database (exactly-once upsert and update: the key claims).

The owner of an object has every privilege on it, so a user that owns the bookkeeping
schema (``CREATE SCHEMA eos AUTHORIZATION <user>``, run once by an administrator) needs
no ``CREATE`` on the database."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from eos_connectors.core.errors import ConfigError
from eos_connectors.sinks.postgres.connection import Connection
from eos_connectors.sinks.postgres.options import PostgresSinkOptions

ROW_PRIVILEGES = ("SELECT", "INSERT", "UPDATE", "DELETE")


def target_privileges(options: PostgresSinkOptions) -> tuple[str, ...]:
    """The privileges the sink's statements take on the target table in its mode."""
    wanted = {
        "append": ("INSERT",),
        "upsert": ("SELECT", "INSERT", "UPDATE"),
        "update": ("SELECT", "UPDATE"),
    }[options.mode]
    return wanted + (("DELETE",) if options.changes.deletes else ())


def missing_grants(
    conn: Connection, options: PostgresSinkOptions, bookkeeping_tables: tuple[str, ...]
) -> list[str]:
    """Driver, at start: a ``GRANT`` statement for each privilege the user lacks."""
    user = _quoted(conn, sql.Identifier(current_user(conn)))
    schema = options.bookkeeping_schema
    staged = options.mode != "append"
    grants = []
    schema_privileges = ("USAGE", "CREATE") if staged else ("USAGE",)
    lacking = [p for p in schema_privileges if not _has(conn, "schema", schema, p)]
    if lacking:
        grants.append(_grant(conn, lacking, "SCHEMA", sql.Identifier(schema), user))
    lacking = _lacking(conn, options.table, target_privileges(options))
    if lacking:
        grants.append(_grant(conn, lacking, "TABLE", sql.Identifier(*options.table), user))
    books = bookkeeping_tables if options.exactly_once else ()
    lacking = sorted(
        {p for name in books for p in _lacking(conn, (schema, name), ROW_PRIVILEGES)},
        key=ROW_PRIVILEGES.index,
    )
    if lacking:
        every = sql.SQL("ALL TABLES IN SCHEMA {}").format(sql.Identifier(schema))
        grants.append(f"GRANT {', '.join(lacking)} ON {every.as_string(conn)} TO {user};")
    database = conn.execute("SELECT current_database()").fetchone()
    name = str(database[0]) if database else ""
    if options.exactly_once and staged and not _has(conn, "database", name, "TEMPORARY"):
        grants.append(_grant(conn, ["TEMPORARY"], "DATABASE", sql.Identifier(name), user))
    return grants


def check(
    conn: Connection, options: PostgresSinkOptions, bookkeeping_tables: tuple[str, ...]
) -> None:
    """Driver, at start: ConfigError listing the grants the user lacks, if any."""
    grants = missing_grants(conn, options, bookkeeping_tables)
    if grants:
        raise ConfigError(
            f"The PostgreSQL user of option 'dsn' ({current_user(conn)}) lacks privileges "
            f"the sink needs in mode {options.mode}. Have the objects' owner run: "
            + " ".join(grants)
            + " (see docs/postgres-sink.md, Privileges)."
        )


@contextmanager
def creating(conn: Connection, what: str, fix: str) -> Iterator[None]:
    """Driver, at start: a ``CREATE`` the user may not run becomes a ConfigError naming
    ``what`` it was creating and the ``fix``, instead of the bare "permission denied"."""
    try:
        yield
    except psycopg.errors.InsufficientPrivilege as exc:
        user = current_user(conn)
        raise ConfigError(
            f"The PostgreSQL user of option 'dsn' ({user}) may not create {what}: {fix} "
            "(see docs/postgres-sink.md, Privileges)."
        ) from exc


def schema_exists(conn: Connection, schema: str) -> bool:
    row = conn.execute("SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = %s)", (schema,))
    return bool((row.fetchone() or (False,))[0])


def existing_tables(conn: Connection, schema: str) -> set[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relkind IN ('r', 'p')",
        (schema,),
    )
    return {str(r[0]) for r in rows.fetchall()}


def has_column(conn: Connection, table: tuple[str, ...], column: str) -> bool:
    """Whether ``table`` (schema, name) has ``column``: from the catalog, as
    :func:`_table_oid` reads it."""
    oid = _table_oid(conn, table)
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_attribute WHERE attrelid = %s::oid AND attname = %s"
        " AND NOT attisdropped)",
        (oid, column),
    ).fetchone()
    return oid is not None and bool(row and row[0])


def current_user(conn: Connection) -> str:
    row = conn.execute("SELECT current_user").fetchone()
    return str(row[0]) if row else ""


def _lacking(conn: Connection, table: tuple[str, ...], privileges: tuple[str, ...]) -> list[str]:
    oid = _table_oid(conn, table)
    return [p for p in privileges if oid is not None and not _has(conn, "table", oid, p)]


def _table_oid(conn: Connection, table: tuple[str, ...]) -> int | None:
    """The table's oid from the catalog, which needs no privilege on its schema (naming
    it in ``has_table_privilege`` would fail on a schema without ``USAGE``)."""
    *schema, name = table
    query = (
        "SELECT c.oid::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = %s AND c.relname = %s"
        if schema
        else "SELECT to_regclass(%s)::oid::bigint"
    )
    args = (schema[0], name) if schema else (_quoted(conn, sql.Identifier(name)),)
    row = conn.execute(query, args).fetchone()
    return int(row[0]) if row and row[0] is not None else None


def _has(conn: Connection, kind: str, name: str | int, privilege: str) -> bool:
    row = conn.execute(f"SELECT has_{kind}_privilege(%s, %s)", (name, privilege)).fetchone()
    return bool(row and row[0])


def _grant(
    conn: Connection, privileges: list[str], kind: str, name: sql.Identifier, user: str
) -> str:
    return f"GRANT {', '.join(privileges)} ON {kind} {_quoted(conn, name)} TO {user};"


def _quoted(conn: Connection, name: sql.Identifier) -> str:
    return name.as_string(conn)
