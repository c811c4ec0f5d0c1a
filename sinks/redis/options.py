"""Options of the ``eos_redis`` sink, parsed once into a frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from redis.connection import parse_url

from eos_connectors.core import options as opt
from eos_connectors.core.changes import CHANGE_OPTIONS, ChangeRules, parse_changes
from eos_connectors.core.errors import ConfigError, keeping_code
from eos_connectors.core.protocol import derive_sink_id
from eos_connectors.core.secrets import redact

URL = opt.Option(
    "url",
    opt.required_text,
    "`redis://`, `rediss://` or `unix://` URL (required). The password never appears in a "
    "log or an error",
)
KEY_COLUMN = opt.Option(
    "keyColumn",
    opt.required_text,
    "the column that names the key (string, binary or integer), prefixed with `keyPrefix` "
    "(required)",
)
VALUE_COLUMNS = opt.Option(
    "valueColumns",
    opt.names,
    "one column: a string value (`SET` / `INCRBY`); one struct column or several columns: "
    "a hash, one field per struct field or column (`HSET` / `HINCRBY`) (required)",
    default=(),
)
KEY_PREFIX = opt.Option(
    "keyPrefix", lambda value, _name: value, "prepended to every key", default=""
)
MODE = opt.Option(
    "mode",
    opt.choice("upsert", "increment"),
    "`upsert` (rows applied in order, the last one wins) or `increment` (numeric values: "
    "integers with `INCRBY`, floats with `INCRBYFLOAT`)",
    default="upsert",
)
TTL_SECONDS = opt.Option(
    "ttlSeconds",
    opt.integer(1),
    "expire written keys after this many seconds (renewed by each write)",
)
BOOKKEEPING_PREFIX = opt.Option(
    "bookkeepingPrefix", opt.required_text, "prefix of the bookkeeping keys", default="eos"
)
SOCKET_TIMEOUT = opt.Option(
    "socketTimeoutMs",
    opt.integer(1000),
    "how long one command (a task's stage, a unit's apply script, a check) waits for Redis's "
    "answer, kept on the client so a frozen server or a network that holds packets fails "
    "the call instead of blocking it; connecting waits at most 10 s (or this, when shorter). "
    "The client never resends a command by itself",
    default=30_000,
)
OPTIONS = opt.OptionTable(
    "eos_redis",
    [
        URL,
        KEY_COLUMN,
        VALUE_COLUMNS,
        KEY_PREFIX,
        MODE,
        TTL_SECONDS,
        BOOKKEEPING_PREFIX,
        SOCKET_TIMEOUT,
        *opt.SINK_OPTIONS,
        *CHANGE_OPTIONS,
    ],
)


@dataclass(frozen=True)
class RedisSinkOptions:
    url: str
    key_column: str
    value_columns: tuple[str, ...]
    key_prefix: str
    mode: Literal["upsert", "increment"]
    ttl_seconds: int | None
    sink_id: str | None
    bookkeeping_prefix: str
    exactly_once: bool
    changes: ChangeRules = field(default_factory=ChangeRules)
    socket_timeout_ms: int = 30_000

    def sink_id_for(self, query_id: str) -> str:
        """The ``sinkId`` option, else one derived from the query id and the target."""
        return self.sink_id or derive_sink_id("rd", query_id, self.key_prefix, self.key_column)

    @property
    def bookkeeping_keys(self) -> str:
        """How every bookkeeping key of the sink starts: ``<bookkeepingPrefix>:{``."""
        return f"{self.bookkeeping_prefix}:{{"

    def __repr__(self) -> str:  # the URL's password never reaches a log line
        return (
            f"RedisSinkOptions(url={redact(self.url)!r}, key_column={self.key_column!r}, "
            f"value_columns={self.value_columns!r}, mode={self.mode!r})"
        )


def parse_options(raw: Mapping[str, str]) -> RedisSinkOptions:
    """Driver: ``raw`` as a frozen value; ConfigError naming the option otherwise."""
    options = OPTIONS.lowered(raw)
    url = opt.required(options, URL, "a redis:// or rediss:// URL, e.g. redis://host:6379/0")
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(
            f"Option 'url' must start with redis://, rediss:// or unix://, got {redact(url)!r}."
        )
    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise keeping_code(
            ConfigError(
                f"Option 'url' is not a valid Redis URL: {redact(url)!r}. Percent-encode @, : "
                "and / in the user and password; the port is a number."
            ),
            exc,
        ) from None
    values = VALUE_COLUMNS.value(options)
    if not values:
        raise ConfigError(
            "Option 'valueColumns' is required: one column (a string value, or a hash for a "
            "struct column) or several (a hash with one field per column)."
        )
    return RedisSinkOptions(
        url=url,
        key_column=opt.required(options, KEY_COLUMN, "the column whose value names the key"),
        value_columns=values,
        key_prefix=KEY_PREFIX.value(options),
        mode=MODE.value(options),
        ttl_seconds=TTL_SECONDS.value(options),
        sink_id=opt.SINK_ID.value(options),
        bookkeeping_prefix=BOOKKEEPING_PREFIX.value(options),
        exactly_once=opt.DELIVERY_GUARANTEE.value(options) == "exactly-once",
        changes=parse_changes(options, "eos_redis"),
        socket_timeout_ms=SOCKET_TIMEOUT.value(options),
    )
