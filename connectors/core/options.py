"""Small helpers every connector uses to turn Spark's string options into typed values."""

from __future__ import annotations

from collections.abc import Mapping, Set

from eos_connectors.core.errors import ConfigError
from eos_connectors.core.java_security import translate

DELIVERY_GUARANTEES = ("exactly-once", "at-least-once")


# Options Spark itself sets on a writeStream (checkpointLocation, queryName, a path), which
# it also hands to the sink.
SPARK_WRITER_OPTIONS = frozenset({"path", "checkpointlocation", "queryname"})


def lowered(raw: Mapping[str, str], known: Set[str], connector: str) -> dict[str, str]:
    """Options with lower-case keys; an unknown key is a ConfigError listing the known ones."""
    options = {k.lower(): v for k, v in raw.items() if k.lower() not in SPARK_WRITER_OPTIONS}
    if options.pop("asyncprogresstrackingenabled", "false").strip().lower() == "true":
        raise ConfigError(
            f"{connector} commits when each batch completes, so batches must run one at a "
            "time: remove asyncProgressTrackingEnabled=true."
        )
    unknown = sorted(set(options) - {k.lower() for k in known})
    if unknown:
        names = ", ".join(sorted(known))
        raise ConfigError(f"Unknown option '{unknown[0]}' for {connector}. Known options: {names}.")
    return options


def kafka_settings(raw: Mapping[str, str], owned: Mapping[str, str]) -> dict[str, str]:
    """``kafka.*`` options for librdkafka, prefix removed, Java's security settings
    translated (:mod:`java_security`); a key in ``owned`` is refused with the reason
    ``owned`` gives."""
    settings: dict[str, str] = {}
    for key, value in raw.items():
        name = key.lower()
        if not name.startswith("kafka."):
            continue
        if name in owned:
            raise ConfigError(f"Option '{key}' cannot be set: {owned[name]}.")
        settings[name.removeprefix("kafka.")] = value
    return translate(settings)


def required(options: Mapping[str, str], name: str, what: str) -> str:
    value = options.get(name.lower(), "").strip()
    if not value:
        raise ConfigError(f"Option '{name}' is required: {what}.")
    return value


def boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = options.get(name.lower())
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false"):
        raise ConfigError(f"Option '{name}' must be true or false, got {value!r}.")
    return value.strip().lower() == "true"


def choice(options: Mapping[str, str], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = options.get(name.lower(), default).strip().lower()
    if value not in allowed:
        raise ConfigError(f"Option '{name}' must be one of {', '.join(allowed)}, got {value!r}.")
    return value


def names(options: Mapping[str, str], name: str) -> tuple[str, ...]:
    """A comma-separated list of names, blanks dropped."""
    return tuple(part.strip() for part in options.get(name.lower(), "").split(",") if part.strip())
