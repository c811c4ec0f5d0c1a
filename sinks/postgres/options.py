"""Options of the ``eos_postgres`` sink, parsed once into a frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict

from eos_connectors.core import options as opt
from eos_connectors.core.changes import CHANGE_OPTIONS, ChangeRules, parse_changes
from eos_connectors.core.errors import ConfigError, keeping_code
from eos_connectors.core.protocol import derive_sink_id
from eos_connectors.core.secrets import redact

MODES = ("append", "upsert", "update")

DSN = opt.Option(
    "dsn",
    opt.required_text,
    "libpq connection string or `postgresql://` URL (required). The password never appears "
    "in a log or an error",
)
TABLE = opt.Option(
    "table",
    opt.required_text,
    "target table, `name` or `schema.name` (required), each part as written (case kept); "
    "a part that opens with a double quote is SQL's quoted name, which may hold a dot: "
    '`"Sales"."Q1.orders"`',
)
MODE = opt.Option(
    "mode",
    opt.choice(*MODES),
    "`append` (COPY), `upsert` (COPY into a stage, then one `INSERT ... ON CONFLICT (keys) "
    "DO UPDATE`; the last row per key wins) or `update` (existing keys only; see "
    "[change-streams.md](change-streams.md))",
    default="append",
)
KEY_COLUMNS = opt.Option(
    "keyColumns",
    opt.names,
    "upsert and update keys; the table needs a unique index on exactly these columns "
    "(a partitioned table: its primary key, which holds the partition columns)",
    default=(),
)
CREATE_TABLE = opt.Option(
    "createTable",
    opt.boolean,
    "create a missing table from the stream's schema (upsert: primary key on the keys)",
    default=False,
)
BOOKKEEPING_SCHEMA = opt.Option(
    "bookkeepingSchema",
    opt.required_text,
    "schema of the `sinks`, `decisions` and `committed_units` tables and upsert stages",
    default="eos",
)
STATEMENT_TIMEOUT = opt.Option(
    "statementTimeoutMs",
    opt.integer(1000),
    "how long each statement that writes a task's rows may run on the server (its "
    "`statement_timeout`; the COPY that takes the rows while Spark computes them is not "
    "bounded as a whole, only each of its waits) and wait for an answer (kept on the "
    "client, 2 s longer, so a frozen server or a network that holds packets fails the task "
    "instead of blocking it); every other call (checks, decisions, `COMMIT PREPARED`) and "
    "a connection attempt wait at most 15 s, or this when shorter",
    default=300_000,
)
OPTIONS = opt.OptionTable(
    "eos_postgres",
    [
        DSN,
        TABLE,
        MODE,
        KEY_COLUMNS,
        CREATE_TABLE,
        BOOKKEEPING_SCHEMA,
        STATEMENT_TIMEOUT,
        *opt.SINK_OPTIONS,
        *CHANGE_OPTIONS,
    ],
)


@dataclass(frozen=True)
class PostgresSinkOptions:
    dsn: str
    table: tuple[str, ...]  # (name,) or (schema, name)
    mode: Literal["append", "upsert", "update"]
    key_columns: tuple[str, ...]
    create_table: bool
    bookkeeping_schema: str
    sink_id: str | None
    exactly_once: bool
    changes: ChangeRules = field(default_factory=ChangeRules)
    statement_timeout_ms: int = 300_000

    @property
    def statement_seconds(self) -> float:
        return self.statement_timeout_ms / 1000

    def __repr__(self) -> str:  # the DSN's password never reaches a log line
        return (
            f"PostgresSinkOptions(dsn={redact(self.dsn)!r}, table={self.table!r}, "
            f"mode={self.mode!r}, key_columns={self.key_columns!r})"
        )

    @property
    def table_name(self) -> str:
        return ".".join(self.table)

    def sink_id_for(self, query_id: str) -> str:
        """The ``sinkId`` option, else one derived from the query id and the table."""
        return self.sink_id or derive_sink_id("pg", query_id, self.table_name)


def parse_options(raw: Mapping[str, str]) -> PostgresSinkOptions:
    """Driver: ``raw`` as a frozen value; ConfigError naming the option otherwise."""
    options = OPTIONS.lowered(raw)
    dsn = opt.required(options, DSN, "a libpq connection string or postgresql:// URL")
    _check_dsn(dsn)
    table = _table(opt.required(options, TABLE, "the target table, as name or schema.name"))
    mode = MODE.value(options)
    keys = KEY_COLUMNS.value(options)
    if mode != "append" and not keys:
        raise ConfigError(f"Option 'keyColumns' is required with mode={mode} (e.g. 'id' or 'a,b').")
    if mode == "append" and keys:
        raise ConfigError("Option 'keyColumns' applies only to mode=upsert and mode=update.")
    changes = parse_changes(options, "eos_postgres")
    if mode == "append" and changes.applies_changes:
        raise ConfigError(
            "Options deleteColumn, deleteWhenValuesNull and orderColumns apply a change stream "
            "by key: use mode=upsert (or mode=update) with keyColumns."
        )
    return PostgresSinkOptions(
        dsn=dsn,
        table=table,
        mode=mode,
        key_columns=keys,
        create_table=CREATE_TABLE.value(options),
        bookkeeping_schema=BOOKKEEPING_SCHEMA.value(options),
        sink_id=opt.SINK_ID.value(options),
        exactly_once=opt.DELIVERY_GUARANTEE.value(options) == "exactly-once",
        changes=changes,
        statement_timeout_ms=STATEMENT_TIMEOUT.value(options),
    )


def _check_dsn(dsn: str) -> None:
    """Refuse a ``dsn`` libpq cannot parse. libpq's own message is left out: it quotes the text
    around the mistake, which is often the password."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.Error as exc:
        raise keeping_code(
            ConfigError(
                "Option 'dsn' is not a valid libpq connection string or postgresql:// URL. "
                "Check its quoting: a value with spaces goes in single quotes, with \\' and \\\\ "
                "escaped inside; in a URL, percent-encode @, : and / in the user and password."
            ),
            exc,
        ) from None


def _table(value: str) -> tuple[str, ...]:
    """``name`` or ``schema.name``, each part exactly as written (the sink quotes it);
    a part that opens with a double quote is SQL's quoted identifier (it may hold a dot,
    and ``""`` stands for a quote)."""
    parts: list[str] = []
    rest = value
    while True:
        if rest.startswith('"'):
            part, rest = _quoted(rest, value)
        else:
            part, dot, after = rest.partition(".")  # as written, quotes and all
            rest = dot + after
        parts.append(part)
        if not rest:
            break
        if not rest.startswith("."):
            raise _bad_table(value, "text right after a closing quote")
        if len(parts) == 2:
            raise _bad_table(value, "more than schema.name")
        rest = rest[1:]
    if any(not p for p in parts):
        raise _bad_table(value, "an empty part")
    return tuple(parts)


def _quoted(text: str, value: str) -> tuple[str, str]:
    """The identifier that ``text`` opens with a double quote, and what follows it."""
    i, part = 1, []
    while i < len(text):
        if text[i] == '"':
            if text[i + 1 : i + 2] == '"':
                part.append('"')
                i += 2
                continue
            return "".join(part), text[i + 1 :]
        part.append(text[i])
        i += 1
    raise _bad_table(value, "a double quote that is never closed")


def _bad_table(value: str, what: str) -> ConfigError:
    return ConfigError(
        f"Option 'table' must be name or schema.name, got {value!r} ({what}). Each part is "
        'taken as written; put a part holding a dot in double quotes: "Sales"."Q1.orders".'
    )
