"""docker-compose.yml runs the same services with the same settings as `eos stack`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from eos_connectors.dev.stack import (
    KAFKA_SETTINGS,
    KAFKA_VERSION,
    POSTGRES_SETTINGS,
    REDIS_SETTINGS,
)

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def _services() -> dict[str, Any]:
    return dict(yaml.safe_load(COMPOSE.read_text())["services"])


def test_kafka_settings_match_the_local_stack() -> None:
    kafka = _services()["kafka"]
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    env = kafka["environment"]
    for key, value in KAFKA_SETTINGS.items():
        assert env["KAFKA_" + key.upper().replace(".", "_")] == value, key
    # Transactions on a single broker need replication 1 and min ISR 1.
    assert env["KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR"] == "1"
    assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "1"


def _command_settings(command: list[str], flag: str) -> dict[str, str]:
    values = [command[i + 1] for i, word in enumerate(command) if word == flag]
    return dict(v.split("=", 1) for v in values)


def test_postgres_settings_match_the_local_stack() -> None:
    postgres = _services()["postgres"]
    assert _command_settings(postgres["command"], "-c") == POSTGRES_SETTINGS
    assert int(POSTGRES_SETTINGS["max_prepared_transactions"]) >= 64


def test_redis_settings_match_the_local_stack() -> None:
    command = _services()["redis"]["command"]
    flags = {command[i][2:]: command[i + 1] for i in range(1, len(command), 2)}
    assert flags == REDIS_SETTINGS
    assert flags["appendonly"] == "yes"


def test_kafka_cluster_ids_never_look_like_an_option() -> None:
    from eos_connectors.dev.stack.kafka import cluster_id

    ids = [cluster_id() for _ in range(2000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


def test_the_cluster_profile_matches_the_replicated_stack() -> None:
    from eos_connectors.dev.stack.kafka_cluster import cluster_settings

    nodes = {name: s for name, s in _services().items() if name.startswith("kafka-")}
    assert sorted(nodes) == ["kafka-1", "kafka-2", "kafka-3"]
    for number, (name, node) in enumerate(sorted(nodes.items()), 1):
        assert node["profiles"] == ["cluster"]
        env = node["environment"]
        assert env["KAFKA_NODE_ID"] == str(number), name
        for key, value in cluster_settings(3).items():
            if key != "node.id":
                assert env["KAFKA_" + key.upper().replace(".", "_")] == value, (name, key)
        assert len(env["CLUSTER_ID"]) == 22 and not env["CLUSTER_ID"].startswith("-")
    assert len({n["environment"]["CLUSTER_ID"] for n in nodes.values()}) == 1
