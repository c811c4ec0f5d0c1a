"""Options of the ``eos_postgres`` sink, parsed once into a frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import psycopg
from psycopg.conninfo import conninfo_to_dict

from eos_connectors.core import options as opt
from eos_connectors.core.changes import CHANGE_OPTIONS, ChangeRules, parse_changes
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.protocol import derive_sink_id
from eos_connectors.core.secrets import redact

_KNOWN = {
    "dsn",
    "table",
    "mode",
    "keyColumns",
    "createTable",
    "bookkeepingSchema",
    "sinkId",
    "txnVersion",
    "deliveryGuarantee",
    *CHANGE_OPTIONS,
}
MODES = ("append", "upsert", "update")


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
    options = opt.lowered(raw, _KNOWN, "eos_postgres")
    dsn = opt.required(options, "dsn", "a libpq connection string or postgresql:// URL")
    _check_dsn(dsn)
    table = _table(opt.required(options, "table", "the target table, as name or schema.name"))
    mode = opt.choice(options, "mode", MODES, "append")
    keys = opt.names(options, "keyColumns")
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
    guarantee = opt.choice(options, "deliveryGuarantee", opt.DELIVERY_GUARANTEES, "exactly-once")
    return PostgresSinkOptions(
        dsn=dsn,
        table=table,
        mode=mode,  # type: ignore[arg-type]
        key_columns=keys,
        create_table=opt.boolean(options, "createTable", False),
        bookkeeping_schema=options.get("bookkeepingschema", "eos").strip() or "eos",
        sink_id=_sink_id(options.get("sinkid")),
        exactly_once=guarantee == "exactly-once",
        changes=changes,
    )


def _check_dsn(dsn: str) -> None:
    """Refuse a ``dsn`` libpq cannot parse. libpq's own message is left out: it quotes the text
    around the mistake, which is often the password."""
    try:
        conninfo_to_dict(dsn)
    except psycopg.Error:
        raise ConfigError(
            "Option 'dsn' is not a valid libpq connection string or postgresql:// URL. "
            "Check its quoting: a value with spaces goes in single quotes, with \\' and \\\\ "
            "escaped inside; in a URL, percent-encode @, : and / in the user and password."
        ) from None


def _table(value: str) -> tuple[str, ...]:
    parts = tuple(value.split(".", 1)) if "." in value and not value.startswith('"') else (value,)
    if any(not p for p in parts):
        raise ConfigError(f"Option 'table' must be name or schema.name, got {value!r}.")
    return parts


def _sink_id(value: str | None) -> str | None:
    if value is None:
        return None
    if not value or len(value) > 64 or "|" in value:
        raise ConfigError(
            "Option 'sinkId' must be 1-64 characters without '|' (it names prepared transactions)."
        )
    return value
