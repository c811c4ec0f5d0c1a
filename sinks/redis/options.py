"""Options of the ``eos_redis`` sink, parsed once into a frozen value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from redis.connection import parse_url

from eos_connectors.core import options as opt
from eos_connectors.core.changes import CHANGE_OPTIONS, ChangeRules, parse_changes
from eos_connectors.core.errors import ConfigError
from eos_connectors.core.protocol import derive_sink_id
from eos_connectors.core.secrets import redact

_KNOWN = {
    "url",
    "keyColumn",
    "valueColumns",
    "keyPrefix",
    "mode",
    "ttlSeconds",
    "sinkId",
    "txnVersion",
    "bookkeepingPrefix",
    "deliveryGuarantee",
    *CHANGE_OPTIONS,
}
MAX_SINK_ID = 64


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
    options = opt.lowered(raw, _KNOWN, "eos_redis")
    url = opt.required(options, "url", "a redis:// or rediss:// URL, e.g. redis://host:6379/0")
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError(
            f"Option 'url' must start with redis://, rediss:// or unix://, got {redact(url)!r}."
        )
    try:
        parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError:
        raise ConfigError(
            f"Option 'url' is not a valid Redis URL: {redact(url)!r}. Percent-encode @, : and / "
            "in the user and password; the port is a number."
        ) from None
    values = opt.names(options, "valueColumns")
    if not values:
        raise ConfigError(
            "Option 'valueColumns' is required: one column (a string value, or a hash for a "
            "struct column) or several (a hash with one field per column)."
        )
    guarantee = opt.choice(options, "deliveryGuarantee", opt.DELIVERY_GUARANTEES, "exactly-once")
    return RedisSinkOptions(
        url=url,
        key_column=opt.required(options, "keyColumn", "the column whose value names the key"),
        value_columns=values,
        key_prefix=options.get("keyprefix", ""),
        mode=opt.choice(options, "mode", ("upsert", "increment"), "upsert"),  # type: ignore[arg-type]
        ttl_seconds=_ttl(options.get("ttlseconds")),
        sink_id=_sink_id(options.get("sinkid")),
        bookkeeping_prefix=options.get("bookkeepingprefix", "eos").strip() or "eos",
        exactly_once=guarantee == "exactly-once",
        changes=parse_changes(options, "eos_redis"),
    )


def _ttl(value: str | None) -> int | None:
    if value is None or not value.strip():
        return None
    if not value.strip().isdigit() or int(value) <= 0:
        raise ConfigError(f"Option 'ttlSeconds' must be a positive whole number, got {value!r}.")
    return int(value)


def _sink_id(value: str | None) -> str | None:
    if value is None:
        return None
    if not value or len(value) > MAX_SINK_ID or any(c in value for c in "|{}"):
        raise ConfigError(
            f"Option 'sinkId' must be 1-{MAX_SINK_ID} characters without '|', '{{' or '}}' "
            "(it names the sink's bookkeeping keys)."
        )
    return value
