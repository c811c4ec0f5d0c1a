"""What importing one connector costs: Spark's Python planner processes and task
workers import one sink or the source, never the others' client libraries, and the
driver-side processes no pyarrow. Cost: ~3 s (one Python process forks a child per
module; the command line's test, a process per command)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

import pytest

OTHER_CLIENTS = {
    "eos_connectors.sinks.kafka": ("psycopg", "redis"),
    "eos_connectors.sinks.postgres": ("redis", "confluent_kafka"),
    "eos_connectors.sinks.redis": ("psycopg", "confluent_kafka"),
    "eos_connectors.sources.kafka": ("psycopg", "redis"),
}


#: What one Python process imports once, before it forks a child per module: what
#: Spark's own data source module brings (every planner and worker has it).
BASELINE = "pyspark.sql.datasource"

_FORKED = """
import importlib, json, os, sys
import {baseline}
found = {{"": [n for n in {names!r} if n in sys.modules]}}
for module in {modules!r}:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        importlib.import_module(module)
        os.write(write, " ".join(n for n in {names!r} if n in sys.modules).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        found[module] = pipe.read().split()
    assert os.waitpid(pid, 0)[1] == 0, module
print(json.dumps(found))
"""


@functools.cache
def _imported() -> dict[str, list[str]]:
    """Module -> which of the watched modules (:data:`HEAVY` and every other client) are
    imported once it is (the key "" holds what :data:`BASELINE` alone imports). One
    Python process imports the baseline, then imports each module in a child forked from
    it: one start of Python and PySpark for all of them (a process per module and one per
    baseline took ~45 s of CPU)."""
    watched = tuple(sorted({*HEAVY, *(n for c in OTHER_CLIENTS.values() for n in c)}))
    modules = (*OTHER_CLIENTS, *DRIVER_SIDE)
    script = _FORKED.format(baseline=BASELINE, names=watched, modules=modules)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    result: dict[str, list[str]] = json.loads(done.stdout)
    return result


def _imported_after(module: str, names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` are imported once ``module`` is ("": the baseline alone)."""
    return [n for n in _imported()[module] if n in names]


@pytest.mark.parametrize("module", sorted(OTHER_CLIENTS))
def test_a_connector_imports_no_other_connectors_client(module: str) -> None:
    assert _imported_after(module, OTHER_CLIENTS[module]) == []


#: What Spark's driver-side Python processes load: the data sources (``create_data_source``,
#: ``lookup_data_sources``), the writers and readers they unpickle to plan, start a write
#: and commit it (``write_into_data_source``, ``python_streaming_sink_runner``,
#: ``commit_data_source_write``, ``python_streaming_source_runner``). Spark forks those
#: from its own daemon, not the package's preloading one, so each pays for its imports:
#: pyarrow and numpy were ~50 MB of a planner worker's unshared memory, and a streaming
#: pipeline runs six to eight such processes (issue 55: 410 of the ~735 MB PSS of a
#: pipeline's Python processes besides the driver).
DRIVER_SIDE = (
    "eos_connectors.registry",
    "eos_connectors.sinks.kafka.batch_commit",
    "eos_connectors.sinks.kafka.exactly_once",
    "eos_connectors.sinks.kafka.at_least_once",
    "eos_connectors.sinks.postgres.exactly_once",
    "eos_connectors.sinks.postgres.at_least_once",
    "eos_connectors.sinks.redis.exactly_once",
    "eos_connectors.sinks.redis.at_least_once",
    "eos_connectors.sinks.redis.admin",
    "eos_connectors.sources.kafka.stream_reader",
    "eos_connectors.sources.kafka.batch_reader",
)


#: What the package must not add to them.
HEAVY = ("pyarrow", "numpy", "pandas")


@pytest.mark.parametrize("module", DRIVER_SIDE)
def test_what_sparks_driver_side_processes_load_imports_no_pyarrow(module: str) -> None:
    """Task work (Arrow batches) imports pyarrow where it runs; the task workers' daemon
    preloads it (eos_connectors.worker_daemon), shared by every worker it forks. What
    PySpark's own data source module loads is not the package's to save: on 4.0 it
    imports numpy (``pyspark.rdd`` -> ``pyspark.statcounter``), on 4.1+ nothing of these."""
    sparks_own = set(_imported_after("", HEAVY))
    assert set(_imported_after(module, HEAVY)) - sparks_own == set()


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
