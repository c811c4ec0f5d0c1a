"""Kafka Connect standalone with Debezium's PostgreSQL connector, for tests that need a real
change stream: jars from Maven Central (once), one worker process on loopback.

The connector reads the stack's PostgreSQL by logical decoding (``pgoutput``; the
stack runs with ``wal_level=logical``) through a publication the caller creates
(``CREATE PUBLICATION <slot> FOR TABLE ...``), and writes one JSON event per changed
row, with Kafka Connect's schema wrapper, to ``<prefix>.<schema>.<table>``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from psycopg.conninfo import conninfo_to_dict

from eos_connectors.dev.stack.kafka import KAFKA_VERSION, maven_jars, maven_pom
from eos_connectors.dev.stack.process import LOOPBACK, free_port, spawn, terminate
from eos_connectors.ops.cache import cache_root

DEBEZIUM_VERSION = "3.6.1.Final"


_LOG4J2 = """appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.stdout.ref = STDOUT
logger.debezium.name = io.debezium
logger.debezium.level = info
"""


def ensure_jars() -> Path:
    """Kafka Connect and Debezium's PostgreSQL connector with their dependencies (once)."""
    pom = maven_pom(
        "kafka-connect-debezium",
        ("org.apache.kafka", "connect-runtime", KAFKA_VERSION),
        ("org.apache.kafka", "connect-json", KAFKA_VERSION),
        ("io.debezium", "debezium-connector-postgres", DEBEZIUM_VERSION),
    )
    cache = cache_root() / f"connect-{KAFKA_VERSION}-debezium-{DEBEZIUM_VERSION}"
    return maven_jars(cache, pom, f"Resolving Kafka Connect and Debezium {DEBEZIUM_VERSION}")


@dataclass(frozen=True)
class DebeziumSource:
    """One Debezium PostgreSQL connector: which tables, under which topic prefix."""

    dsn: str
    tables: tuple[str, ...]  # schema.table
    prefix: str  # topics are <prefix>.<schema>.<table>
    slot: str  # the replication slot it makes, and the publication the caller made

    def connector_properties(self) -> dict[str, str]:
        parts = conninfo_to_dict(self.dsn)
        return {
            "name": self.prefix,
            "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
            "tasks.max": "1",
            "plugin.name": "pgoutput",
            "database.hostname": str(parts.get("host") or LOOPBACK),
            "database.port": str(parts.get("port") or 5432),
            "database.user": str(parts.get("user") or ""),
            "database.password": str(parts.get("password") or ""),
            "database.dbname": str(parts.get("dbname") or ""),
            "topic.prefix": self.prefix,
            "table.include.list": ",".join(self.tables),
            "slot.name": self.slot,
            "publication.name": self.slot,
            "publication.autocreate.mode": "disabled",  # made by the caller: FOR TABLE
            "snapshot.mode": "initial",
            # The stack's broker creates no topic by itself: Connect creates the table's.
            "topic.creation.default.replication.factor": "1",
            "topic.creation.default.partitions": "2",
        }


@contextmanager
def connect_worker(bootstrap: str, source: DebeziumSource, log: Path) -> Iterator[None]:
    """A Kafka Connect standalone worker running ``source`` until the block ends; its
    settings (with the database password) in files only their owner can read."""
    from eos_connectors.dev.stack.kafka import INSTALL_HINT
    from eos_connectors.dev.stack.process import require_binary

    java = require_binary("java", INSTALL_HINT)
    jars = ensure_jars()
    work = Path(tempfile.mkdtemp(prefix="eos-connect-"))
    worker = {
        "bootstrap.servers": bootstrap,
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "true",
        "value.converter.schemas.enable": "true",
        "offset.storage.file.filename": str(work / "offsets"),
        "offset.flush.interval.ms": "1000",
        "listeners": f"http://{LOOPBACK}:{free_port()}",
        "plugin.discovery": "only_scan",
    }
    (work / "log4j2.properties").write_text(_LOG4J2)
    worker_file = _private(work / "worker.properties", worker)
    connector_file = _private(work / "connector.properties", source.connector_properties())
    argv = [
        java,
        "-Xmx512m",
        f"-Dlog4j2.configurationFile={work / 'log4j2.properties'}",
        "-cp",
        f"{jars}/*",
        "org.apache.kafka.connect.cli.ConnectStandalone",
        str(worker_file),
        str(connector_file),
    ]
    pid = spawn(argv, log, work)
    try:
        yield
    finally:
        terminate(pid)
        shutil.rmtree(work, ignore_errors=True)


def _private(path: Path, settings: dict[str, str]) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.writelines(f"{key}={value}\n" for key, value in settings.items())
    return path
