"""What importing one connector costs: Spark's Python planner processes and task
workers import one sink or the source, never the others' client libraries."""

from __future__ import annotations

import subprocess
import sys

import pytest

OTHER_CLIENTS = {
    "eos_connectors.sinks.kafka": ("psycopg", "redis"),
    "eos_connectors.sinks.postgres": ("redis", "confluent_kafka"),
    "eos_connectors.sinks.redis": ("psycopg", "confluent_kafka"),
    "eos_connectors.sources.kafka": ("psycopg", "redis"),
}


def _imported_after(module: str, names: tuple[str, ...]) -> list[str]:
    script = f"import sys, {module}; print(*[n for n in {names!r} if n in sys.modules])"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    return done.stdout.split()


@pytest.mark.parametrize("module", sorted(OTHER_CLIENTS))
def test_a_connector_imports_no_other_connectors_client(module: str) -> None:
    assert _imported_after(module, OTHER_CLIENTS[module]) == []


def test_the_sinks_package_still_names_the_postgres_source() -> None:
    from eos_connectors import sinks

    assert sinks.PostgresDataSource.name() == "eos_postgres"
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        sinks.Nope  # noqa: B018


def _modules_after(code: str) -> set[str]:
    script = f"import sys\n{code}\nprint(' '.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    return set(done.stdout.split())


def test_the_command_line_imports_no_tooling_until_a_command_needs_it() -> None:
    """``eos --help`` and ``eos --version`` import nothing but the command line (not even
    Spark); the operator commands' ``--help`` none of the development tooling (stack,
    harness, benchmarks) nor what it needs (psutil, matplotlib): a plain install's CLI
    starts whatever an extra or the tooling would bring."""
    tooling = ("eos_connectors.dev", "matplotlib", "psutil")
    # What PySpark's data source API imports itself on this release (4.0's pyspark.shuffle
    # imports psutil) is not the command line's doing.
    spark_brings = _modules_after("import pyspark.sql.datasource")
    for argv in (["--version"], ["--help"], *([c, "--help"] for c in OPERATOR_COMMANDS)):
        heavy = tooling if argv[0] in OPERATOR_COMMANDS else (*tooling, "pyspark")
        code = (
            "from eos_connectors.cli import main\n"
            "try:\n"
            f"    main({argv!r})\n"
            "except SystemExit:\n"
            "    pass"
        )
        loaded = _modules_after(code) - spark_brings
        creeping = sorted(m for m in loaded if m.startswith(heavy))
        assert creeping == [], f"eos {' '.join(argv)} imported {creeping}"


OPERATOR_COMMANDS = ("sinks", "checkpoint", "savepoint", "state")
