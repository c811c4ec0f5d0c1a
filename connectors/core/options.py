"""Options, each declared once: its name, how its text becomes a value, its default, where it
applies and what it does.

A connector declares its options as one :class:`OptionTable` of :class:`Option`\\ s
(as Flink's ``ConfigOptions`` and Spark's ``KafkaSourceProvider`` constants do).
Everything else derives from that table: the known names (an unknown option is
refused, listing them), parsing (each option's parser names the option in its
error), the defaults, the refusal of an option where it does not apply (a batch
write's ``txnVersion`` on a stream), and the options table of the connector's docs
page (``python -m eos_connectors.dev.docs``; ``tests/unit/test_option_docs.py``
fails when a page and its table differ).

Options that mean the same in every sink are declared here once, with one parser
each: :data:`SINK_ID`, :data:`TXN_VERSION`, :data:`STREAM_CHECKPOINT`,
:data:`DELIVERY_GUARANTEE`.

Everything here runs on the driver, when a format builds its reader or writer.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from eos_connectors.core.errors import ConfigError


class Applies(Enum):
    """Where an option applies: streams (``readStream``/``writeStream``), batch reads and
    writes (``read``/``write``), or both."""

    BOTH = "stream and batch"
    STREAM = "stream"
    BATCH = "batch"


#: (value, option name) -> the typed value; a ConfigError naming the option otherwise.
Parser = Callable[[str, str], Any]


@dataclass(frozen=True)
class Option:
    """One option: ``name`` as users write it (matched case-insensitively)."""

    name: str
    parse: Parser
    doc: str
    default: Any = None
    #: how the default reads in the docs (None: the default's own text, "" for none)
    default_doc: str | None = None
    applies: Applies = Applies.BOTH
    #: set: the option is refused whatever its value, with this reason (a setting the
    #: connector owns, such as ``kafka.enable.idempotence``)
    refused: str | None = None

    @property
    def key(self) -> str:
        return self.name.lower()

    def value(self, options: Mapping[str, str]) -> Any:
        """This option's value in lower-cased ``options``, parsed; the default when unset."""
        text = options.get(self.key)
        return self.default if text is None else self.parse(text, self.name)

    def documented_default(self) -> str:
        if self.default_doc is not None:
            return self.default_doc
        if self.default is None:
            return ""
        if isinstance(self.default, bool):
            return f"`{str(self.default).lower()}`"
        if isinstance(self.default, tuple):
            return f"`{','.join(self.default)}`" if self.default else ""
        return f"`{self.default}`"


# Options Spark itself hands to every writer (checkpointLocation, queryName, a path).
SPARK_WRITER_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})
#: Spark's asynchronous progress tracking runs batches ahead of their commit: refused.
ASYNC_PROGRESS = "asyncprogresstrackingenabled"


class OptionTable:
    """A connector's options. ``passthrough``: prefixes of names handed on as they are
    (``kafka.``), checked by the connector's own client settings."""

    def __init__(
        self, connector: str, options: Iterable[Option], passthrough: tuple[str, ...] = ()
    ) -> None:
        self.connector = connector
        self.options = tuple(options)
        self.passthrough = passthrough
        keys = [o.key for o in self.options]
        if len(keys) != len(set(keys)):
            raise ValueError(f"{connector}: an option is declared twice: {sorted(keys)}")
        self._by_key = {o.key: o for o in self.options}

    def __getitem__(self, name: str) -> Option:
        return self._by_key[name.lower()]

    @property
    def names(self) -> tuple[str, ...]:
        """The declared names, as users write them."""
        return tuple(o.name for o in self.options)

    def lowered(self, raw: Mapping[str, str]) -> dict[str, str]:
        """``raw`` with lower-cased keys, Spark's own writer options dropped; ConfigError for
        an unknown option (listing the known ones) and for a refused one."""
        options = {k.lower(): v for k, v in raw.items() if k.lower() not in SPARK_WRITER_OPTIONS}
        if options.pop(ASYNC_PROGRESS, "false").strip().lower() == "true":
            raise ConfigError(
                f"{self.connector} commits when each batch completes, so batches must run one at "
                "a time: remove asyncProgressTrackingEnabled=true."
            )
        for key in options:
            option = self._by_key.get(key)
            if option is not None and option.refused is not None:
                raise ConfigError(f"Option '{option.name}' cannot be set: {option.refused}.")
            if option is None and not key.startswith(self.passthrough):
                known = ", ".join(
                    [*(o.name for o in self.options if o.refused is None)]
                    + [f"{p}*" for p in self.passthrough]
                )
                raise ConfigError(
                    f"Unknown option '{key}' for {self.connector}. Known options: {known}."
                )
        return options

    def outside(self, options: Mapping[str, str], applies: Applies) -> tuple[Option, ...]:
        """The options set in lower-cased ``options`` that do not apply to ``applies``."""
        return tuple(
            o for o in self.options if o.key in options and o.applies not in (Applies.BOTH, applies)
        )

    def markdown(self) -> str:
        """The options table of the connector's docs page."""
        rows = ["| option | default | applies to | meaning |", "| --- | --- | --- | --- |"]
        for option in self.options:
            applies = option.applies.value
            meaning = f"refused: {option.refused}" if option.refused else option.doc
            rows.append(
                f"| `{option.name}` | {option.documented_default()} | {applies} | {meaning} |"
            )
        rows += [f"| `{p}*` | | {Applies.BOTH.value} | see below |" for p in self.passthrough]
        return "\n".join(rows)


def required(options: Mapping[str, str], option: Option, what: str) -> Any:
    """``option``'s value in lower-cased ``options``; ConfigError saying ``what`` it is when
    it is unset or blank."""
    if not options.get(option.key, "").strip():
        raise ConfigError(f"Option '{option.name}' is required: {what}.")
    return option.value(options)


# -- parsers: (text, option name) -> value ---------------------------------------------------


def text(value: str, name: str) -> str:
    """Any text, stripped."""
    return value.strip()


def required_text(value: str, name: str) -> str:
    if not value.strip():
        raise ConfigError(f"Option '{name}' must not be empty.")
    return value.strip()


def boolean(value: str, name: str) -> bool:
    lowered = value.strip().lower()
    if lowered not in ("true", "false"):
        raise ConfigError(f"Option '{name}' must be true or false, got {value!r}.")
    return lowered == "true"


_DIGITS = re.compile(r"-?[0-9]+")


def integer(minimum: int, maximum: int | None = None) -> Parser:
    """A whole number in ASCII digits (``int()`` would take other scripts' digits and
    underscores) from ``minimum`` to ``maximum``."""

    def parse(value: str, name: str) -> int:
        if _DIGITS.fullmatch(value.strip()) is None:
            raise ConfigError(f"Option '{name}' must be a whole number, got {value!r}.")
        number = int(value.strip())
        if number < minimum:
            raise ConfigError(f"Option '{name}' must be >= {minimum}, got {number}.")
        if maximum is not None and number > maximum:
            raise ConfigError(f"Option '{name}' must be <= {maximum}, got {number}.")
        return number

    return parse


def choice(*allowed: str) -> Parser:
    """One of ``allowed``, case-insensitively; the value is lower-cased."""

    def parse(value: str, name: str) -> str:
        lowered = value.strip().lower()
        if lowered not in allowed:
            raise ConfigError(
                f"Option '{name}' must be one of {', '.join(allowed)}, got {lowered!r}."
            )
        return lowered

    return parse


def names(value: str, name: str) -> tuple[str, ...]:
    """A comma-separated list of names, blanks dropped."""
    return tuple(part.strip() for part in value.split(",") if part.strip())


#: Spark's time suffixes (JavaUtils.timeStringAs): us, ms, s, m, min, h, d.
_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|min|m|h|d)?\s*$", re.IGNORECASE | re.ASCII)
_UNIT_US = {
    "us": 1,
    "ms": 1000,
    "s": 1_000_000,
    "m": 60_000_000,
    "min": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
}


def duration_ms(value: str, name: str) -> int:
    """A duration as Spark's options write it (``15m``, ``15min``, ``30s``, ``500ms``; a
    bare number is milliseconds), in whole milliseconds (as Spark rounds: down)."""
    found = _DURATION.match(value)
    if found is None:
        raise ConfigError(
            f"Option '{name}' must be a duration such as 30s, 15m, 15min or 500ms, got {value!r}."
        )
    return int(found.group(1)) * _UNIT_US[(found.group(2) or "ms").lower()] // 1000


# -- the options every sink shares -----------------------------------------------------------

#: A sink id names prepared transactions, Redis keys and Kafka transactional ids and
#: consumer groups: one rule for all of them.
MAX_SINK_ID = 64
_SINK_ID_FORBIDDEN = "|{}"


def sink_id(value: str, name: str) -> str:
    """1-64 characters, none of ``|``, ``{``, ``}`` (they separate the parts of the names
    the sink id goes into), no surrounding blanks."""
    if (
        not value
        or value != value.strip()
        or len(value) > MAX_SINK_ID
        or any(c in value for c in _SINK_ID_FORBIDDEN)
        or not value.isprintable()
    ):
        raise ConfigError(
            f"Option '{name}' must be 1-{MAX_SINK_ID} printable characters without '|', '{{' "
            f"or '}}' and without surrounding blanks, got {value!r}: it names the sink's "
            "bookkeeping (prepared transactions, keys, transactional ids)."
        )
    return value


MAX_TXN_VERSION = 2**63 - 1

DELIVERY_GUARANTEES = ("exactly-once", "at-least-once")

SINK_ID = Option(
    "sinkId",
    sink_id,
    "stable identity of the sink, owned by one query or batch job "
    "([operations.md](operations.md#sink-ids)); default derived from the query id and the "
    "target",
    default_doc="derived",
)
TXN_VERSION = Option(
    "txnVersion",
    integer(0, MAX_TXN_VERSION),
    "which load of the batch job named by `sinkId` this is, a number that grows with every "
    "new load; required with `sinkId` for an exactly-once batch write "
    "([batch-writes.md](batch-writes.md))",
    applies=Applies.BATCH,
)
STREAM_CHECKPOINT = Option(
    "streamCheckpoint",
    required_text,
    "in a stream's `foreachBatch`, with `txnVersion` its batch id: the stream's "
    "`checkpointLocation` (a local, `file:` or `hdfs:` path); the write then records the "
    "source positions its batch planned and refuses one planned again over others "
    "([batch-writes.md](batch-writes.md#one-stream-into-several-sinks-foreachbatch))",
    applies=Applies.BATCH,
)
DELIVERY_GUARANTEE = Option(
    "deliveryGuarantee",
    choice(*DELIVERY_GUARANTEES),
    "`exactly-once` or `at-least-once` (each task writes directly; a replayed batch writes again)",
    default="exactly-once",
)
SINK_OPTIONS = (SINK_ID, TXN_VERSION, STREAM_CHECKPOINT, DELIVERY_GUARANTEE)
