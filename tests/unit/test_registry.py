from __future__ import annotations

from typing import Any

import pytest

from eos_connectors.core.errors import ConfigError
from eos_connectors.registry import OPTIONS_REDACTION, data_sources, register


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str) -> str:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class _Session:
    """Just the two attributes register() touches: its conf and dataSource.register."""

    def __init__(self, conf: dict[str, str]) -> None:
        self.conf = _Conf(conf)
        self.registered: list[Any] = []
        self.dataSource = self

    def register(self, source: Any) -> None:
        self.registered.append(source)


def test_registers_every_data_source_by_name() -> None:
    session = _Session({})
    names = register(session)  # type: ignore[arg-type]
    assert names == ["eos_kafka", "eos_postgres", "eos_redis"]
    assert session.registered == data_sources()


def test_speculative_execution_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"spark\.speculation is true"):
        register(_Session({"spark.speculation": "true"}))  # type: ignore[arg-type]


def test_a_connector_authors_sources_are_registered_too() -> None:
    from examples.sqlite_sink import SqliteDataSource

    session = _Session({})
    names = register(session, extra=[SqliteDataSource])  # type: ignore[arg-type]
    assert names[-1] == "eos_sqlite" and session.registered[-1] is SqliteDataSource


def test_a_url_with_a_password_is_redacted_in_sparks_plans() -> None:
    """PySpark 4.0 quotes a failed query's plan, sink options included: ``dsn`` (a
    postgresql:// URL may hold the password) joins the options Spark redacts, and a
    pattern the session set stays."""
    import re

    session = _Session({})
    register(session)  # type: ignore[arg-type]
    pattern = session.conf.values[OPTIONS_REDACTION]
    assert all(re.search(pattern, name) for name in ("dsn", "DSN", "url"))
    assert not re.search(pattern, "table")
    session = _Session({OPTIONS_REDACTION: "(?i)url|secretish"})
    register(session)  # type: ignore[arg-type]
    register(session)  # type: ignore[arg-type]  # once is enough
    assert session.conf.values[OPTIONS_REDACTION] == "(?i)url|secretish|(?i:dsn)"
