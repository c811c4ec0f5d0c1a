"""Kafka's own command-line tools (``kafka-transactions.sh``) from their Maven Central jars,
for tests that ask Kafka itself, not this package, what a run left behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

from eos_connectors.core.errors import StackError
from eos_connectors.dev.stack.kafka import INSTALL_HINT, KAFKA_VERSION, maven_jars, maven_pom
from eos_connectors.dev.stack.process import require_binary
from eos_connectors.ops.cache import cache_root

TRANSACTIONS_COMMAND = "org.apache.kafka.tools.TransactionsCommand"


def tools_jars() -> Path:
    """``kafka-tools`` and its runtime dependencies, resolved by Maven once per user."""
    pom = maven_pom("kafka-tools", ("org.apache.kafka", "kafka-tools", KAFKA_VERSION))
    return maven_jars(
        cache_root() / f"kafka-tools-{KAFKA_VERSION}",
        pom,
        f"Resolving Kafka's tools {KAFKA_VERSION}",
    )


def kafka_transactions(bootstrap: str, *args: str, timeout_s: float = 60.0) -> str:
    """``kafka-transactions.sh --bootstrap-server BOOTSTRAP ARGS`` (``list``,
    ``find-hanging --broker-id N``, ...): what it printed. A plaintext listener."""
    command = [require_binary("java", INSTALL_HINT), "-Xmx256m", "-cp", f"{tools_jars()}/*"]
    command += [TRANSACTIONS_COMMAND, "--bootstrap-server", bootstrap, *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise StackError(
            f"kafka-transactions {' '.join(args)} failed ({done.returncode}): "
            f"{(done.stderr or done.stdout)[-2000:]}"
        )
    return done.stdout


def transaction_version(bootstrap: str) -> int:
    """The cluster's finalized ``transaction.version`` (0 when none is finalized), as a
    broker reports it in its ApiVersions answer."""
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="eos-stack-features")
    try:
        features = admin.describe_features()
    finally:
        admin.close()
    finalized = features.get("transaction.version", {}).get("finalized")
    return int(finalized[1]) if finalized else 0
