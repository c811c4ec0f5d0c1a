"""``eos_postgres``: the data source Spark instantiates by format name."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import psycopg
from psycopg import sql
from pyspark.sql.types import StructType

from eos_connectors.core import batch_job
from eos_connectors.core.changes import check_schema as check_changes
from eos_connectors.core.checkpoint_sinks import (
    SinkEntry,
    checkpoint_location,
    postgres_endpoint,
    record_at_start,
)
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.sink_switch import (
    StartingSink,
    at_least_once_sink,
    check_moved_bookkeeping,
    settle_before_at_least_once,
    starting_sink,
)
from eos_connectors.core.sinks_admin import ORPHAN_AGE_SECONDS, SinkRecord
from eos_connectors.core.sinks_admin import warn_about_orphans as shared_warning
from eos_connectors.core.startup import once_per_driver, start_key
from eos_connectors.sinks.postgres import key_claims, privileges
from eos_connectors.sinks.postgres import schema as pg_schema
from eos_connectors.sinks.postgres.at_least_once import PostgresAtLeastOnceWriter
from eos_connectors.sinks.postgres.connection import Connection, connect
from eos_connectors.sinks.postgres.exactly_once import (
    PostgresExactlyOnceWriter,
    create_aborted_runs,
)
from eos_connectors.sinks.postgres.options import PostgresSinkOptions, parse_options

log = logging.getLogger(__name__)

MIN_PREPARED_TRANSACTIONS = 1
NAME = "eos_postgres"


class PostgresDataSource(batch_job.SinkFormat):
    """Streaming sink into a PostgreSQL table, exactly once through two-phase commit.

    See :class:`~eos_connectors.sinks.postgres.exactly_once.PostgresExactlyOnceWriter` for
    the guarantee.
    """

    @classmethod
    def name(cls) -> str:
        return "eos_postgres"

    @property
    def sink_config(self) -> PostgresSinkOptions:
        return parse_options(self.options)

    connector = NAME
    instead_of_overwrite = "empty the table first, or write with mode=upsert and keyColumns"

    def _writer(
        self, schema: StructType, overwrite: bool
    ) -> PostgresExactlyOnceWriter | PostgresAtLeastOnceWriter:
        options = self.sink_config
        if overwrite and options.mode == "append":
            raise ConfigError(
                "outputMode 'complete' rewrites the whole result every batch: with mode=append "
                "the table would collect copies. Use mode=upsert with keyColumns, or outputMode "
                "'append' / 'update'."
            )
        missing = [k for k in options.key_columns if k not in schema.fieldNames()]
        if missing:
            raise ConfigError(f"Option 'keyColumns' names columns not in the stream: {missing}.")
        check_changes(options.changes, schema, options.key_columns, NAME)
        once_per_driver(
            start_key("eos_postgres", self.options, schema),
            lambda: start_checks(options, schema, self.options),
        )
        columns = tuple(schema.fieldNames())
        control = tuple(
            (f.name, pg_schema.pg_type(f.name, f.dataType))
            for f in schema.fields
            if f.name in options.changes.control_columns
        )
        location = checkpoint_location(self.options)
        if options.exactly_once:
            return PostgresExactlyOnceWriter(options, columns, control, location)
        return PostgresAtLeastOnceWriter(options, columns, control, location)


def start_checks(
    options: PostgresSinkOptions, schema: StructType, raw: Mapping[str, str] | None = None
) -> None:
    """Driver, at a query's start: the server, the bookkeeping, the table, orphans; the
    sink recorded in the query's checkpoint (``raw``: Spark's options)."""
    with connect(options) as conn:
        check_server(conn, options)
        ensure_bookkeeping(conn, options.bookkeeping_schema)
        ensure_table(conn, options, schema)
        privileges.check(conn, options, BOOKKEEPING_TABLES)
    if options.exactly_once:
        starting = starting_sink(raw or {}, options.sink_id_for, NAME)
        warn_about_orphans(options, starting=starting)
        if starting is not None:
            _check_moved_bookkeeping(options, starting)
        record_at_start(raw or {}, lambda query_id: checkpoint_entry(options, query_id))
    else:
        from eos_connectors.sinks.postgres.admin import PostgresSinkAdmin

        sid = at_least_once_sink(raw or {}, options.sink_id, options.sink_id_for)
        admin = PostgresSinkAdmin(options.dsn, options.bookkeeping_schema)
        settle_before_at_least_once(admin, sid, NAME)


def _check_moved_bookkeeping(options: PostgresSinkOptions, starting: StartingSink) -> None:
    """Driver, at a stream's start: ``bookkeepingSchema`` changed since the earlier start while
    the sink's last batch there is incomplete is refused (``check_moved_bookkeeping``)."""
    from eos_connectors.sinks.postgres.admin import PostgresSinkAdmin

    check_moved_bookkeeping(
        starting,
        "postgres",
        "bookkeepingSchema",
        options.bookkeeping_schema,
        lambda old: PostgresSinkAdmin(options.dsn, old),
    )


def checkpoint_entry(options: PostgresSinkOptions, query_id: str) -> SinkEntry:
    """The sink as its query's checkpoint records it (see ``core.checkpoint_sinks``)."""
    sink_id = options.sink_id_for(query_id)
    names = {"bookkeepingSchema": options.bookkeeping_schema}
    endpoint = postgres_endpoint(options.dsn)
    return SinkEntry("postgres", sink_id, query_id, options.table_name, endpoint, names)


def warn_about_orphans(
    options: PostgresSinkOptions,
    older_than: float = ORPHAN_AGE_SECONDS,
    starting: StartingSink | None = None,
) -> list[SinkRecord]:
    """Driver, at query start: prepared transactions of sink ids on this table (or of
    unknown target) that nobody settled for ``older_than`` seconds, logged as a warning.
    First, with ``starting``, a stream restarted through another sink id mid-batch is
    refused (``refuse_a_switch_mid_batch``)."""
    from eos_connectors.sinks.postgres.admin import PostgresSinkAdmin

    admin = PostgresSinkAdmin(options.dsn, options.bookkeeping_schema)
    return shared_warning(admin, options.table_name, "PostgreSQL", older_than, starting)


def check_server(conn: Connection, options: PostgresSinkOptions) -> None:
    """Refuse a server the sink cannot write to; for exactly-once, one that cannot
    prepare transactions."""
    _refuse_read_only(conn)
    _refuse_shared_sessions(conn, options)
    if not options.exactly_once:
        return
    row = conn.execute("SHOW max_prepared_transactions").fetchone()
    if row is None or int(row[0]) < MIN_PREPARED_TRANSACTIONS:
        raise ConfigError(
            "PostgreSQL has max_prepared_transactions = 0, so it cannot prepare transactions "
            "and eos_postgres cannot commit exactly once. Set max_prepared_transactions to at "
            "least the number of sink tasks per batch (e.g. 64) in postgresql.conf and restart "
            "the server, or use deliveryGuarantee=at-least-once."
        )


def _refuse_read_only(conn: Connection) -> None:
    """A standby (a managed service's reader endpoint) or a session that is read-only by
    default refuses every write: said at start, naming option 'dsn', instead of as the
    first CREATE or COPY's bare error."""
    row = conn.execute("SELECT pg_is_in_recovery(), current_setting('transaction_read_only')")
    standby, read_only = row.fetchone() or (False, "off")
    if standby:
        raise ConfigError(
            "Option 'dsn' points at a PostgreSQL standby, which is read-only. Point it at the "
            "primary (on a managed service, the writer endpoint, not a reader endpoint)."
        )
    if read_only == "on":
        raise ConfigError(
            "Option 'dsn' opens read-only sessions (default_transaction_read_only is on for "
            "its user or database, or in its options): the sink cannot write. Connect as a "
            "user that may write, or turn that setting off for it."
        )


def _refuse_shared_sessions(conn: Connection, options: PostgresSinkOptions) -> None:
    """A pooler that hands one server session to whichever client runs the next
    transaction (PgBouncer's ``pool_mode`` transaction or statement) gives a second
    connection the session the first one just left idle. The sink keeps state in its
    sessions (a session lock held across ``ROLLBACK PREPARED``, psycopg's prepared
    statements), which such a pooler would hand to another client."""
    first = conn.execute("SELECT pg_backend_pid()").fetchone()
    with connect(options) as other:
        second = other.execute("SELECT pg_backend_pid()").fetchone()
    if first == second:
        raise ConfigError(
            "Option 'dsn' reaches PostgreSQL through a pooler that shares server sessions "
            "between clients (PgBouncer's pool_mode transaction or statement): two "
            "connections of the sink ran in one server session. The sink keeps state in its "
            "sessions: connect to PostgreSQL directly, or to the pooler in session mode."
        )


def ensure_bookkeeping(conn: Connection, bookkeeping_schema: str) -> None:
    """The decisions table, the table each prepared transaction records its unit in, the
    owner (query) and target of each sink id, the key claims and the aborted runs: each
    created only when missing, so a user that may not create (the schema made for it by
    an administrator) starts, and a user that must gets an error naming the fix.

    No other DDL here: a statement that locks these tables would wait on every
    prepared transaction still holding its insert into ``committed_units``. (The one
    ``ALTER TABLE`` of ``decisions``, :func:`_add_offsets_column`, runs once per table;
    no prepared transaction touches ``decisions``.)"""
    schema = sql.Identifier(bookkeeping_schema)
    user = sql.Identifier(privileges.current_user(conn)).as_string(conn)
    named = schema.as_string(conn)
    if not privileges.schema_exists(conn, bookkeeping_schema):
        what = f"the bookkeeping schema {named} (option 'bookkeepingSchema')"
        fix = f"have an administrator run CREATE SCHEMA {named} AUTHORIZATION {user};"
        with privileges.creating(conn, what, fix):
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(schema))
    existing = privileges.existing_tables(conn, bookkeeping_schema)
    missing = [name for name in BOOKKEEPING_TABLES if name not in existing]
    if missing:
        what = f"the bookkeeping tables {', '.join(missing)} in schema {named}"
        fix = f"GRANT CREATE ON SCHEMA {named} TO {user}; or ALTER SCHEMA {named} OWNER TO {user};"
        with privileges.creating(conn, what, fix):
            for name in missing:
                _create_bookkeeping_table(conn, bookkeeping_schema, name)
    _add_offsets_column(conn, bookkeeping_schema)


def _add_offsets_column(conn: Connection, bookkeeping_schema: str) -> None:
    """A ``decisions`` table made before it kept each batch's source positions (its
    ``offsets`` column, for the commit's check of a checkpoint put back by one batch:
    ``core.checkpoint_behind``) gets the column, when this user owns the table and no
    session holds it for 5 s; else a warning names the statement, and the sink runs
    without that one check (it reads and writes the column only where it exists)."""
    decisions = sql.Identifier(bookkeeping_schema, "decisions")
    if privileges.has_column(conn, (bookkeeping_schema, "decisions"), "offsets"):
        return
    alter = sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS offsets text").format(decisions)
    try:
        with conn.transaction():
            conn.execute("SET LOCAL lock_timeout = '5s'")
            conn.execute(alter)
    except (psycopg.errors.InsufficientPrivilege, psycopg.errors.LockNotAvailable) as exc:
        log.warning(
            "%s: %s. Without the column the sink cannot tell a checkpoint put back by one "
            'batch from a replay (docs/operations.md, "A checkpoint restored from an '
            "older copy\"); have the table's owner run: %s;",
            decisions.as_string(conn),
            str(exc).splitlines()[0],
            alter.as_string(conn),
        )


#: The columns of the bookkeeping tables made here (the key claims and aborted runs are
#: made by their own modules).
_BOOKKEEPING_COLUMNS = {
    "decisions": (
        "sink_id text NOT NULL, batch_id bigint NOT NULL, query_id text NOT NULL,"
        " units text[] NOT NULL, decided_at timestamptz NOT NULL DEFAULT now(),"
        " offsets text, PRIMARY KEY (sink_id, batch_id)"
    ),
    "committed_units": (
        "sink_id text NOT NULL, batch_id bigint NOT NULL, unit text NOT NULL,"
        " committed_at timestamptz NOT NULL DEFAULT now(),"
        " PRIMARY KEY (sink_id, batch_id, unit)"
    ),
    "sinks": (
        "sink_id text PRIMARY KEY, query_id text NOT NULL, origin text NOT NULL DEFAULT '',"
        " target text NOT NULL, claimed_at timestamptz NOT NULL DEFAULT now()"
    ),
}
BOOKKEEPING_TABLES = (*_BOOKKEEPING_COLUMNS, key_claims.TABLE, "aborted_runs")


def _create_bookkeeping_table(conn: Connection, schema: str, name: str) -> None:
    if name == key_claims.TABLE:
        key_claims.create_table(conn, schema)
    elif name == "aborted_runs":
        create_aborted_runs(conn, schema)
    else:
        columns = sql.SQL(_BOOKKEEPING_COLUMNS[name])  # type: ignore[arg-type]  # constants
        table = sql.Identifier(schema, name)
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(table, columns))


def ensure_table(conn: Connection, options: PostgresSinkOptions, schema: StructType) -> None:
    """The table exists (or is created) with a column for each written column (a change
    stream's control columns are not written)."""
    control = options.changes.control_columns
    schema = StructType([f for f in schema.fields if f.name not in control])
    columns = pg_schema.table_columns(conn, options.table)
    if columns is None:
        if not options.create_table:
            raise ConfigError(
                f"Table {options.table_name} does not exist. Create it, or set createTable=true "
                "to create it from the stream's schema."
            )
        what = f"table {options.table_name} (option createTable)"
        fix = "create the table as its owner, or grant CREATE on its schema to the user;"
        with privileges.creating(conn, what, fix):
            pg_schema.create_table(conn, options.table, schema, options.key_columns)
        columns = pg_schema.table_columns(conn, options.table) or {}
    pg_schema.check_columns(options.table_name, schema, columns)
    if options.mode == "upsert":
        pg_schema.check_unique_key(conn, options.table, options.key_columns)
