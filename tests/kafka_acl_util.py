"""A SCRAM user of the local broker holding only the ACLs a test grants it: the ACLs
docs/deploy.md lists for the Kafka sink and source, or those less one.

The stack's broker checks ACLs (KRaft's StandardAuthorizer); its plain listeners and its
own SASL user are super users. A broker without an authorizer (docker-compose.yml's)
answers SECURITY_DISABLED, and the test is skipped.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from eos_connectors.dev.endpoints import Endpoints, KafkaSasl
from eos_connectors.dev.stack.kafka import add_scram_user
from eos_connectors.sinks.kafka.coordinator import OFFSETS_TOPIC  # the driver needs DESCRIBE

READ, WRITE, CREATE, DESCRIBE = (
    AclOperation.READ,
    AclOperation.WRITE,
    AclOperation.CREATE,
    AclOperation.DESCRIBE,
)
TOPIC, GROUP, TXN_ID = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID


@dataclass(frozen=True)
class Grant:
    """One ACL: ``operation`` on ``resource`` ``name`` (a prefix when ``prefixed``)."""

    resource: ResourceType
    name: str
    operation: AclOperation
    prefixed: bool = False

    def binding(self, principal: str) -> AclBinding:
        pattern = ResourcePatternType.PREFIXED if self.prefixed else ResourcePatternType.LITERAL
        allow = AclPermissionType.ALLOW
        return AclBinding(self.resource, self.name, pattern, principal, "*", self.operation, allow)


def sink_grants(sink_id: str, topic: str, marker_log: str, prefix: str = "eos") -> list[Grant]:
    """docs/deploy.md's list for the Kafka sink ``sink_id`` writing ``topic``."""
    names = f"{prefix}-{sink_id}-"
    return [
        Grant(TXN_ID, names, WRITE, prefixed=True),
        Grant(TXN_ID, names, DESCRIBE, prefixed=True),
        Grant(GROUP, names, READ, prefixed=True),
        Grant(TOPIC, topic, WRITE),
        Grant(TOPIC, topic, READ),
        Grant(TOPIC, marker_log, READ),
        Grant(TOPIC, marker_log, WRITE),
        Grant(TOPIC, marker_log, CREATE),
        Grant(TOPIC, OFFSETS_TOPIC, DESCRIBE),
    ]


def source_grants(topic: str) -> list[Grant]:
    """docs/deploy.md's list for the source reading ``topic``: READ alone (it implies
    DESCRIBE), no consumer group."""
    return [Grant(TOPIC, topic, READ)]


class Principal:
    """A new SCRAM user on the broker's SASL listener and the ACLs granted to it."""

    def __init__(self, endpoints: Endpoints, sasl: KafkaSasl, grants: list[Grant]) -> None:
        self.admin = AdminClient({**endpoints.kafka, "log_level": 0})
        username = f"limited-{secrets.token_hex(4)}"
        self.sasl = replace(sasl, username=username, password=secrets.token_hex(16))
        self.name = f"User:{username}"
        add_scram_user(endpoints.kafka_bootstrap, (username, self.sasl.password))
        self.grant(grants)

    def grant(self, grants: list[Grant]) -> None:
        self._wait(self.admin.create_acls([g.binding(self.name) for g in grants]))

    @staticmethod
    def _wait(futures: Mapping[Any, Future[Any]]) -> None:
        try:
            for future in futures.values():
                future.result(timeout=30)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.SECURITY_DISABLED:
                pytest.skip("this broker checks no ACLs; `eos stack up` starts one that does")
            raise
