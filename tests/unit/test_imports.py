"""What importing one connector costs: Spark's Python planner processes and task
workers import one sink or the source, never the others' client libraries."""

from __future__ import annotations

import subprocess
import sys

import pytest

OTHER_CLIENTS = {
    "sinks.kafka": ("psycopg", "redis"),
    "sinks.postgres": ("redis", "confluent_kafka"),
    "sinks.redis": ("psycopg", "confluent_kafka"),
    "sources.kafka": ("psycopg", "redis"),
}


def _imported_after(module: str, names: tuple[str, ...]) -> list[str]:
    script = f"import sys, {module}; print(*[n for n in {names!r} if n in sys.modules])"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True, timeout=60)  # fmt: skip
    return done.stdout.split()


@pytest.mark.parametrize("module", sorted(OTHER_CLIENTS))
def test_a_connector_imports_no_other_connectors_client(module: str) -> None:
    assert _imported_after(module, OTHER_CLIENTS[module]) == []


def test_the_sinks_package_still_names_the_postgres_source() -> None:
    import sinks

    assert sinks.PostgresDataSource.name() == "eos_postgres"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        sinks.Nope  # noqa: B018
