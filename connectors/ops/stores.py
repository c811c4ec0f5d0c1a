"""The stores whose sink bookkeeping the tools read, named by the environment only.

``EOS_POSTGRES_DSN``, ``EOS_REDIS_URL``, ``EOS_KAFKA_BOOTSTRAP`` (``eval "$(eos stack
env)"`` sets them for the local stack), so no password is ever on a command line; a
store whose variable is unset is left out. A Kafka cluster behind SASL or TLS takes
its client settings from the file ``EOS_KAFKA_CONFIG`` names: ``key=value`` lines of
librdkafka settings, with or without the ``kafka.`` prefix of the connectors' options
(``security.protocol``, ``sasl.mechanism``, ``sasl.username``, ``sasl.password``,
``ssl.ca.location``...). Driver-side tooling.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from eos_connectors.core.checkpoint_sinks import SinkEntry
from eos_connectors.core.errors import ConfigError, keeping_code
from eos_connectors.core.kafka_config import from_java
from eos_connectors.core.sinks_admin import (
    ResetGuard,
    SinkAdmin,
    SinkAdminError,
    SinkRecord,
)
from eos_connectors.ops.checkpoint import CheckpointError, read_checkpoint


@dataclass(frozen=True)
class BookkeepingNames:
    """Where each sink keeps its bookkeeping, when not at the default: the sinks'
    ``bookkeepingSchema``, ``bookkeepingPrefix``, ``transactionalIdPrefix`` and
    ``markerLogTopic`` options."""

    bookkeeping_schema: str = "eos"
    bookkeeping_prefix: str = "eos"
    transactional_id_prefix: str = "eos"
    marker_log_topic: str = "eos-sink-markers"


@contextmanager
def admins(names: BookkeepingNames = BookkeepingNames()) -> Iterator[list[SinkAdmin]]:
    """A SinkAdmin per store the environment names; ConfigError when it names none."""
    found: list[SinkAdmin] = []
    try:
        _connect(found, names)
    except BaseException:  # one store unreachable: the others' connections close
        for admin in found:
            admin.close()
        raise
    if not found:
        raise ConfigError(
            "No store to look in: set EOS_POSTGRES_DSN, EOS_REDIS_URL and/or "
            'EOS_KAFKA_BOOTSTRAP (for the local stack: eval "$(eos stack env)").'
        )
    try:
        yield found
    finally:
        for admin in found:
            admin.close()


def _connect(found: list[SinkAdmin], names: BookkeepingNames) -> None:
    """Driver-side tooling: an admin per store the environment names, into ``found``."""
    if os.environ.get("EOS_POSTGRES_DSN"):
        from eos_connectors.sinks.postgres.admin import PostgresSinkAdmin

        found.append(PostgresSinkAdmin(os.environ["EOS_POSTGRES_DSN"], names.bookkeeping_schema))
    if os.environ.get("EOS_REDIS_URL"):
        from eos_connectors.sinks.redis.admin import RedisSinkAdmin

        found.append(RedisSinkAdmin(os.environ["EOS_REDIS_URL"], names.bookkeeping_prefix))
    if os.environ.get("EOS_KAFKA_BOOTSTRAP"):
        from eos_connectors.sinks.kafka.admin import KafkaSinkAdmin

        found.append(
            KafkaSinkAdmin(
                kafka_client_config(), names.transactional_id_prefix, names.marker_log_topic
            )
        )


def all_records(names: BookkeepingNames = BookkeepingNames()) -> list[SinkRecord] | None:
    """Every store's sink records, or None when the environment names no store."""
    records: list[SinkRecord] = []
    try:
        with admins(names) as found:
            for admin in found:
                records.extend(admin.records())
    except ConfigError:
        return None
    return records


def kafka_client_config() -> dict[str, str]:
    """``EOS_KAFKA_BOOTSTRAP`` with the settings of the file ``EOS_KAFKA_CONFIG`` names (a
    Java client's properties file as it is: its settings are translated)."""
    config: dict[str, str] = {}
    path = os.environ.get("EOS_KAFKA_CONFIG")
    if path:
        try:
            lines = Path(path).read_text().splitlines()
        except OSError as exc:
            raise keeping_code(
                ConfigError(f"EOS_KAFKA_CONFIG names {path}, which cannot be read: {exc}."), exc
            ) from None
        for number, line in enumerate(lines, 1):
            text = line.strip()
            if not text or text.startswith(("#", "!")):
                continue
            key, sep, value = text.partition("=")
            if not sep:
                raise ConfigError(f"{path} line {number}: expected key=value.")
            config[key.strip().removeprefix("kafka.")] = value.strip()
    config["bootstrap.servers"] = os.environ["EOS_KAFKA_BOOTSTRAP"]
    return from_java(config)


def store_admin(entry: SinkEntry) -> SinkAdmin:
    """The admin of the store a checkpoint recorded ``entry`` in, under its names; the
    connection (with its credentials) from the environment, which must name that store."""
    from eos_connectors.core.checkpoint_sinks import postgres_endpoint, redis_endpoint

    variable = _STORE_VARIABLES[entry.store]
    value = os.environ.get(variable)
    if not value:
        raise CheckpointError(
            f"The checkpoint records sink {entry.sink_id} in {entry.store} at {entry.endpoint}: "
            f"set {variable} to reach it."
        )
    where = {"postgres": postgres_endpoint, "redis": redis_endpoint}.get(entry.store, str)(value)
    if where != entry.endpoint:
        raise CheckpointError(
            f"The checkpoint records sink {entry.sink_id} in {entry.store} at {entry.endpoint}, "
            f"but {variable} names {where}: point it at the sink's store."
        )
    if entry.store == "postgres":
        from eos_connectors.sinks.postgres.admin import PostgresSinkAdmin

        return PostgresSinkAdmin(value, entry.names.get("bookkeepingSchema", "eos"))
    if entry.store == "redis":
        from eos_connectors.sinks.redis.admin import RedisSinkAdmin

        return RedisSinkAdmin(value, entry.names.get("bookkeepingPrefix", "eos"))
    from eos_connectors.sinks.kafka.admin import KafkaSinkAdmin

    return KafkaSinkAdmin(
        kafka_client_config(),
        entry.names.get("transactionalIdPrefix", "eos"),
        entry.names.get("markerLogTopic", "eos-sink-markers"),
    )


_STORE_VARIABLES = {
    "postgres": "EOS_POSTGRES_DSN",
    "redis": "EOS_REDIS_URL",
    "kafka": "EOS_KAFKA_BOOTSTRAP",
}


_STORE_VARIABLES = {
    "postgres": "EOS_POSTGRES_DSN",
    "redis": "EOS_REDIS_URL",
    "kafka": "EOS_KAFKA_BOOTSTRAP",
}


def recorded_sinks(recorded: list[SinkEntry]) -> list[SinkRecord]:
    """The bookkeeping of the sinks a checkpoint records, each read in its own store under
    its own names; CheckpointError when a store is not named by the environment, is
    another one than the checkpoint's, or does not answer."""
    records: list[SinkRecord] = []
    for entry in recorded:
        admin = store_admin(entry)
        try:
            found = admin.find(entry.sink_id)
            if found is not None:
                records.append(found)
        except Exception as exc:  # any client's error: the store did not answer
            raise keeping_code(
                CheckpointError(
                    f"Could not read sink {entry.sink_id} in {entry.store} at {entry.endpoint}: "
                    f"{type(exc).__name__}. Resuming needs every sink the checkpoint records."
                ),
                exc,
            ) from None
        finally:
            admin.close()
    return records


def reset_guard(checkpoint_path: str | None, quiet_seconds: float) -> ResetGuard:
    """What ``eos sinks reset`` checks: from the owning query's checkpoint, which must be
    committed to its last batch (None: the checkpoint is deleted for good)."""
    if checkpoint_path is None:
        return ResetGuard(None, None, quiet_seconds)
    checkpoint = read_checkpoint(checkpoint_path)
    if not checkpoint.clean:
        raise SinkAdminError(
            f"Not resetting: {checkpoint.path} planned batch {checkpoint.last_planned} but "
            f"committed only {checkpoint.last_committed}, so its query replays that batch when "
            "it restarts, and the replay needs the sink's bookkeeping to write it once. "
            "Restart the query until the batch commits, stop it, then reset."
        )
    return ResetGuard(checkpoint.query_id, checkpoint.last_committed, quiet_seconds)
