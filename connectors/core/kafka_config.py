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

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from eos_connectors.core.errors import ConfigError
from eos_connectors.core.java_security import translate
from eos_connectors.core.secrets import redact, secret_values
from eos_connectors.core.tls_context import ssl_context

#: Facilities of librdkafka's lines about a connection it retries or an id it is still
#: getting, or a client's clean-up: librdkafka retries on its own, and a call that cannot
#: finish raises (the connector's error says what failed), so these are INFO.
TRANSIENT_FACILITIES = frozenset({"FAIL", "GETPID", "BGQUEUE", "DESTROY", "TERMINATE"})


class Transient(logging.Filter):
    """Lowers librdkafka's lines of :data:`TRANSIENT_FACILITIES` to INFO (confluent-kafka
    logs ``"%s [%s] %s" % (facility, client name, text)``); decided by facility."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if args and args[0] in TRANSIENT_FACILITIES and record.levelno > logging.INFO:
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


#: librdkafka's own lines, through Python logging rather than straight to the terminal.
LIBRDKAFKA_LOG = logging.getLogger("eos_connectors.librdkafka")
LIBRDKAFKA_LOG.addFilter(Transient())


class _Quiet(logging.Filter):
    """Every line at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


#: librdkafka's lines of a client whose failure its caller says itself, once (a start
#: check's throwaway client, ``eos sinks``'s admin): at DEBUG, never on the terminal.
QUIET_LOG = logging.getLogger("eos_connectors.librdkafka.quiet")
QUIET_LOG.addFilter(_Quiet())


def logged(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` for a client whose log lines go to :data:`LIBRDKAFKA_LOG`."""
    return {**settings, "logger": LIBRDKAFKA_LOG}


#: librdkafka's settings, ``bootstrap.servers`` among them.
KafkaConfig = Mapping[str, Any]

BOOTSTRAP = "bootstrap.servers"
_CONNECTION_PREFIXES = ("security.", "sasl.", "ssl.", "https.")


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
    return from_java(settings)


def from_java(settings: dict[str, str]) -> dict[str, str]:
    """``settings`` (librdkafka's or a Java client's names, no prefix) in librdkafka's
    terms: the security settings translated, :data:`JAVA_NAMES` renamed."""
    return _renamed(translate(settings))


#: Java client settings librdkafka has under another name, with the same meaning and
#: unit, so a Spark job's options carry over (Java's -1, "the system's default", is
#: librdkafka's 0 for the socket buffers).
JAVA_NAMES = {
    "max.request.size": "message.max.bytes",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "fetch.max.wait.ms": "fetch.wait.max.ms",
}


def _renamed(settings: dict[str, str]) -> dict[str, str]:
    """``settings`` with :data:`JAVA_NAMES` in librdkafka's names; ConfigError when both
    names of one setting are given with different values."""
    for java, ours in JAVA_NAMES.items():
        if java not in settings:
            continue
        value = settings.pop(java)
        if ours.startswith("socket.") and value.strip() == "-1":
            value = "0"
        if settings.setdefault(ours, value) != value:
            raise ConfigError(
                f"Options 'kafka.{java}' (Java's name) and 'kafka.{ours}' (librdkafka's) are "
                "one setting, given two values: keep one."
            )
    return settings


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


#: The commit mode option a setting the driver's client cannot honour names.
FALLBACK_HINT = "commitMode=task (each task commits its own transaction)"
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
_SASL_SETTINGS = {"sasl.username": "sasl_plain_username", "sasl.password": "sasl_plain_password"}
_TLS_SETTINGS = (
    "ssl.ca.location",
    "ssl.ca.pem",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.password",
    "ssl.certificate.pem",
    "ssl.key.pem",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.endpoint.identification.algorithm",
)
#: The OAUTHBEARER settings the driver's client takes (:mod:`.oauth_token`).
OAUTH_SETTINGS = (
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.client.credentials.client.id",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.extensions",
    "sasl.oauthbearer.grant.type",
    "sasl.oauthbearer.config",
    "https.ca.location",
    "https.ca.pem",
)
_HANDLED = {BOOTSTRAP, "security.protocol", "sasl.mechanism", "sasl.mechanisms"}
_HANDLED |= {*_SASL_SETTINGS, *_TLS_SETTINGS, *OAUTH_SETTINGS}


def to_kafka_python(config: KafkaConfig) -> dict[str, Any]:
    """The connection settings of ``config`` (librdkafka names) as kafka-python's keyword
    arguments, for the driver's transaction client; ConfigError naming a setting that
    client cannot honour and the fallback mode. A function of the dict alone."""
    settings = connection(config)
    unknown = sorted(k for k in settings if k not in _HANDLED)
    if unknown:
        raise ConfigError(
            f"Setting 'kafka.{unknown[0]}' cannot be honoured by the driver's transaction "
            f"client (kafka-python); remove it or use {FALLBACK_HINT}."
        )
    protocol = str(settings.get("security.protocol", "plaintext")).upper()
    out: dict[str, Any] = {
        "bootstrap_servers": [s.strip() for s in str(settings[BOOTSTRAP]).split(",") if s.strip()],
        "security_protocol": protocol,
    }
    mechanism = settings.get("sasl.mechanism", settings.get("sasl.mechanisms"))
    if mechanism is not None:
        if str(mechanism).upper() not in _MECHANISMS:
            raise ConfigError(
                f"SASL mechanism {mechanism!r} cannot be used by the driver's transaction "
                f"client (it speaks {', '.join(_MECHANISMS)}); use {FALLBACK_HINT}."
            )
        out["sasl_mechanism"] = str(mechanism).upper()
        if out["sasl_mechanism"] == "OAUTHBEARER":
            from eos_connectors.core.oauth_token import OAuthTokens  # kafka-python: driver only

            out["sasl_oauth_token_provider"] = OAuthTokens(settings, FALLBACK_HINT)
    for name, keyword in _SASL_SETTINGS.items():
        if name in settings:
            out[keyword] = settings[name]
    if protocol.endswith("SSL"):
        out["ssl_context"] = ssl_context(settings)
    return out


#: Java client settings librdkafka has no setting for, with what to do instead.
JAVA_ONLY = {
    "buffer.memory": "set kafka.queue.buffering.max.kbytes (the producer's queue, in KiB)",
    "interceptor.classes": "drop it: librdkafka runs no Java interceptors",
    "metric.reporters": "drop it: the source's and sink's progress reports their metrics",
    "key.serializer": "drop it: the key column's bytes are written as they are",
    "value.serializer": "drop it: the value column's bytes are written as they are",
    "max.block.ms": "drop it: librdkafka bounds its calls with its own timeouts",
    "partitioner.class": "set kafka.partitioner (librdkafka's), or give the rows a partition",
    "partitioner.ignore.keys": "set kafka.partitioner (librdkafka's), or give rows a partition",
    "partitioner.adaptive.partitioning.enable": "drop it: set kafka.partitioner (librdkafka's)",
    "compression.gzip.level": "set kafka.compression.level (for kafka.compression.type's codec)",
    "compression.lz4.level": "set kafka.compression.level (for kafka.compression.type's codec)",
    "compression.zstd.level": "set kafka.compression.level (for kafka.compression.type's codec)",
    "default.api.timeout.ms": "drop it: librdkafka bounds each request itself",
    "exclude.internal.topics": "drop it: the source reads only the topics its options name",
    "metadata.max.idle.ms": "drop it: see kafka.topic.metadata.refresh.interval.ms (librdkafka's)",
    "ssl.protocol": "drop it: librdkafka takes the TLS versions its OpenSSL allows",
    "ssl.enabled.protocols": "drop it: librdkafka takes the TLS versions its OpenSSL allows",
    "sasl.login.callback.handler.class": "drop it: librdkafka loads no Java classes",
    "sasl.client.callback.handler.class": "drop it: librdkafka loads no Java classes",
    "sasl.login.class": "drop it: librdkafka loads no Java classes",
}


def check_settings(
    config: KafkaConfig,
    build: Callable[[dict[str, Any]], object],
    who: str,
    given: Iterable[str] = (),
) -> None:
    """Driver, at start: librdkafka takes every setting of ``config`` as the client
    ``build`` makes it (a client built and dropped at once: its settings are checked when
    it is made, before it connects), so a Java-only name or a setting that contradicts
    what the connector forces fails here, naming the option, and not in every task.
    ``given``: the settings the user set, one of which is named when the client refuses
    (the first whose removal lets it build)."""
    for name, instead in JAVA_ONLY.items():
        if name in config:
            raise ConfigError(
                f"{who}: option 'kafka.{name}' is a Java client setting librdkafka does not "
                f"have: {instead}."
            )
    reason = _refusal(config, build)
    if reason is None:
        return
    culprit = next(
        (n for n in given if n in config and _refusal(_without(config, n), build) is None), None
    )
    java = {ours: java for java, ours in JAVA_NAMES.items()}.get(culprit or "")
    named = f"option 'kafka.{culprit}'" if culprit else "a kafka.* option"
    named += f" (set as Java's 'kafka.{java}', or as it)" if java else ""
    raise ConfigError(
        f"{who}: librdkafka refuses {named}: {redact(reason, secret_values(config))}. "
        f"{_kerberos_hint(config, build)}Each kafka.<name> option goes to librdkafka as "
        "<name> (its names, Java's for the common settings)."
    )


_MECHANISM_NAMES = ("sasl.mechanism", "sasl.mechanisms")


def _kerberos_hint(config: KafkaConfig, build: Callable[[dict[str, Any]], object]) -> str:
    """What to do when GSSAPI is what librdkafka refuses (it builds with another
    mechanism): the confluent-kafka wheels on PyPI have no Kerberos, their librdkafka
    being built without Cyrus SASL."""
    named = [n for n in _MECHANISM_NAMES if str(config.get(n, "")).upper() == "GSSAPI"]
    if not named:
        return ""
    plain = {**config, named[0]: "PLAIN", "sasl.username": "-", "sasl.password": "-"}
    if _refusal(plain, build) is not None:
        return ""
    return (
        "Kerberos (GSSAPI) needs a confluent-kafka built from source against a librdkafka "
        "with Cyrus SASL (libsasl2): the wheels on PyPI are built without it. "
    )


def _refusal(config: KafkaConfig, build: Callable[[dict[str, Any]], object]) -> str | None:
    """Why librdkafka refuses to build a client of ``config``, or None when it builds."""
    try:
        build({**config, "logger": QUIET_LOG})
    except Exception as exc:  # confluent_kafka.KafkaException: an invalid setting
        error = exc.args[0] if exc.args else exc
        return str(error.str() if hasattr(error, "str") else error)
    return None


def _without(config: KafkaConfig, name: str) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != name}
