"""Kafka client settings: one librdkafka dict, from a ``kafka.*`` option to the client.

A source's or sink's ``kafka.*`` options become one dict of librdkafka settings,
``bootstrap.servers`` inside it, once, on the driver (:func:`from_options`): the
prefix dropped, a Java job's security settings translated
(:mod:`eos_connectors.core.java_security`), the settings a connector owns refused
with the reason. Every client of the package is built from that dict or a part of
it: :func:`connection` is what any client needs to reach the cluster (the bootstrap
servers and the ``security.*``, ``sasl.*`` and ``ssl.*`` settings), so an admin
client, a marker reader or a topic helper reaches a SASL or TLS listener as the
producer does. Nothing splits the bootstrap servers off and puts them back on the
way.

A client of another library takes the same dict through a translation that is a
function of it alone, as :func:`java_security.translate` is for Java's names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from eos_connectors.core.errors import ConfigError
from eos_connectors.core.java_security import translate

#: librdkafka's settings, ``bootstrap.servers`` among them.
KafkaConfig = Mapping[str, Any]

BOOTSTRAP = "bootstrap.servers"
_CONNECTION_PREFIXES = ("security.", "sasl.", "ssl.")


def from_options(raw: Mapping[str, str], owned: Mapping[str, str]) -> dict[str, str]:
    """Driver: the ``kafka.*`` options of ``raw`` as librdkafka settings (prefix dropped,
    Java's security settings translated); ConfigError for an option in ``owned`` (with
    the reason it gives) and for a missing ``kafka.bootstrap.servers``."""
    settings: dict[str, str] = {}
    for key, value in raw.items():
        name = key.lower()
        if not name.startswith("kafka."):
            continue
        if name in owned:
            raise ConfigError(f"Option '{key}' cannot be set: {owned[name]}.")
        settings[name.removeprefix("kafka.")] = value
    if not settings.get(BOOTSTRAP, "").strip():
        raise ConfigError("Option 'kafka.bootstrap.servers' is required (host:port[,host:port]).")
    return translate(settings)


def connection(config: KafkaConfig) -> dict[str, Any]:
    """What every client needs to reach the cluster of ``config``: the bootstrap servers
    and the security settings (SASL, TLS), nothing that shapes a producer or consumer."""
    return {
        key: value
        for key, value in config.items()
        if key == BOOTSTRAP or key.startswith(_CONNECTION_PREFIXES)
    }


def bootstrap(config: KafkaConfig) -> str:
    """The bootstrap servers of ``config``, for messages."""
    return str(config.get(BOOTSTRAP, ""))


def plaintext(servers: str) -> dict[str, str]:
    """The settings of a plaintext listener at ``servers`` (tooling and tests)."""
    return {BOOTSTRAP: servers}
