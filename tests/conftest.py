"""Service fixtures: real Kafka, PostgreSQL and Redis, never mocks.

Endpoints come from ``EOS_KAFKA_BOOTSTRAP`` / ``EOS_POSTGRES_DSN`` / ``EOS_REDIS_URL``
when set; else from docker compose (pytest-docker) when a Docker engine answers;
else from the package's own stack (``eos stack up``). A test that needs a service
fails, never skips, when the service can't be had.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from eos_connectors.dev.endpoints import Endpoints, KafkaSasl
from eos_connectors.dev.harness.pytest_plugin import harness_runner
from eos_connectors.dev.harness.verify import Report

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ROOT = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker but the first gets a stack of its own (``<root>-gw1``):
    a test's services are never shared with a test running beside it, so the units it
    leaves in doubt are its own and a service one test restarts is nobody else's."""
    from eos_connectors.dev.stack import default_root

    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    if worker != "gw0":
        os.environ["EOS_STACK_DIR"] = f"{default_root()}-{worker}"


def _docker_engine_answers() -> bool:
    if os.environ.get("EOS_NO_DOCKER") or shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
    return probe.returncode == 0


@pytest.fixture(scope="session")
def docker_compose_file() -> str:
    return str(ROOT / "docker-compose.yml")


def _compose_endpoints(request: pytest.FixtureRequest) -> Endpoints:
    from eos_connectors.dev.stack.kafka import kafka_answers

    services = request.getfixturevalue("docker_services")
    bootstrap = "localhost:9092"
    services.wait_until_responsive(check=lambda: kafka_answers(bootstrap), timeout=120, pause=1)
    return Endpoints(
        bootstrap, "postgresql://eos:eos@localhost:5432/eos", "redis://localhost:6379/0"
    )


@pytest.fixture(scope="session")
def endpoints(request: pytest.FixtureRequest) -> Iterator[Endpoints]:
    from_env = Endpoints.from_env()
    if from_env is not None:
        yield from_env
        return
    if _docker_engine_answers():
        yield _compose_endpoints(request)
        return
    from eos_connectors.dev.stack import Stack

    stack = Stack()
    # Stop it afterwards only if none of it ran before: a service found down (say, one
    # a harness run is restarting) does not make the rest of the stack ours to stop.
    # HDFS is not one of them: the hdfs_url fixture may have started it first in this
    # session (Kafka, PostgreSQL and Redis were then left running after the session).
    was_up = any(s.running for s in stack.status() if s.name != "hdfs")
    found = stack.up()
    os.environ.update(found.as_env())  # subprocesses (pipelines under test) see the same stack
    yield found
    if not was_up and not os.environ.get("EOS_KEEP_STACK"):
        stack.down()


def _in_doubt(endpoints: Endpoints) -> set[str]:
    """Every unit of this package's sinks left in doubt in the stores now: PostgreSQL
    prepared transactions and Redis stage lists."""
    import psycopg
    import redis

    with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
        prepared = conn.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, 'eos|')"
        ).fetchall()
    client = redis.Redis.from_url(endpoints.redis_url)
    try:
        stages = [k.decode() for k in client.scan_iter("*}:stage:*", count=1000)]
    finally:
        client.close()
    return {f"prepared transaction {g}" for (g,) in prepared} | {f"Redis {k}" for k in stages}


@pytest.fixture(autouse=True, scope="module")
def idle_clients_closed() -> Iterator[None]:
    """The package's client pools are a Spark Python worker's, kept across its tasks; a
    test process drives writers of many modules, and the idle clients of all of them
    held past 1,100 file descriptors (a CI run hung: Py4J's callback server, started
    late on a descriptor past 1,023, which ``select()`` cannot watch, never answered a
    streaming listener). Each module's are closed when it ends."""
    yield
    from eos_connectors.core.kept import close_idle

    close_idle()


@pytest.fixture(autouse=True)
def nothing_left_in_doubt(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that uses the services ends with nothing of its own left in doubt: a unit it
    prepared and never settled (a prepared transaction holds row locks and a slot of
    max_prepared_transactions) fails the test that left it, as psycopg's own TPC tests
    do. Units other tests left before are not this test's."""
    if "endpoints" not in request.fixturenames:
        yield
        return
    endpoints: Endpoints = request.getfixturevalue("endpoints")
    before, topics = _in_doubt(endpoints), _topics(endpoints)
    yield
    left = sorted(_in_doubt(endpoints) - before)
    left += sorted(_open_transactions(endpoints, _topics(endpoints) - topics))
    assert not left, f"this test left units in doubt: {left[:5]}"


def _topics(endpoints: Endpoints) -> set[str]:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
    return set(admin.list_topics(timeout=30).topics)


def _open_transactions(endpoints: Endpoints, topics: set[str]) -> list[str]:
    """Kafka has no cheap way to list open transactions: a transaction left open on a
    topic the test made holds that partition's last stable offset below the partition's
    end as it is now (see ``checks.open_transactions_in``; nothing is written)."""
    from eos_connectors.dev.harness.checks import open_transactions_in

    made = sorted(t for t in topics if not t.startswith("__"))
    stuck = open_transactions_in(endpoints.kafka_bootstrap, made, timeout=5)
    return [f"an open Kafka transaction on {t}[{p}]" for t, p in sorted(stuck)]


@pytest.fixture
def unique() -> str:
    """A short unique name for topics, tables and keys of one test."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def crash_service(endpoints: Endpoints) -> Callable[[str], None]:
    """SIGKILL a service of the package's stack and start it again on the same port."""
    from eos_connectors.dev.harness.services import crash_function

    crash = crash_function(endpoints)
    if crash is None:
        pytest.fail(
            "This test restarts a service, which it can do only with the package's own stack "
            "(`eos stack up`); the endpoints came from EOS_* variables or docker compose."
        )
    return crash


@pytest.fixture
def eos_verify(
    endpoints: Endpoints, tmp_path: Path, request: pytest.FixtureRequest
) -> Callable[..., Report]:
    """The harness (eos_connectors.dev.harness.pytest_plugin) on the session's services: run
    first, it would start the stack itself and the session would not stop it. Each run's
    whole-pipeline runs (how each ended, how long it took) go to
    ``test-results/harness-runs.md``, so a slow CI run says where its time went."""
    run = harness_runner(tmp_path)

    def logged(**fields: object) -> Report:
        report = run(**fields)
        record_runs(request.node.nodeid, report)
        return report

    return logged


def record_runs(test: str, report: Report) -> None:
    """Append the report's runs to ``test-results/harness-runs.md`` (a table)."""
    from tests.tiers import RESULTS

    path = RESULTS / "harness-runs.md"
    RESULTS.mkdir(exist_ok=True)
    lines = (
        []
        if path.exists()
        else [
            "| test | run | ended by | seconds | points fired | query failures |",
            "| --- | --: | --- | --: | --: | --- |",
        ]
    )
    for r in report.runs:
        failures = ", ".join(f"{q}: {n}" for q, n in sorted(r.query_failures.items())) or "-"
        ended = r.ended_by + (f" ({r.service_crashed} restarted)" if r.service_crashed else "")
        lines.append(
            f"| `{test}` | {r.number} | {ended} | {r.seconds:.0f} | {len(r.faults)} | {failures} |"
        )
    with path.open("a") as out:
        out.write("\n".join(lines) + "\n")


@pytest.fixture(scope="session")
def spark_master() -> Iterator[str]:
    """A Spark standalone cluster on loopback (a master, two one-core workers):
    ``EOS_SPARK_MASTER`` when set, else the package stack's, started for the session
    and stopped after it unless it ran before or ``EOS_KEEP_STACK=1``."""
    explicit = os.environ.get("EOS_SPARK_MASTER")
    if explicit:
        yield explicit
        return
    from eos_connectors.dev.stack import Stack

    stack = Stack()
    was_up = stack.spark_master() is not None
    master = stack.up_spark(workers=2)
    yield master
    if not was_up and not os.environ.get("EOS_KEEP_STACK"):
        stack.down_spark()


@pytest.fixture(scope="session")
def hdfs_url() -> Iterator[str]:
    """HDFS (a NameNode and a DataNode) on loopback: ``EOS_HDFS_URL`` when set, else the
    package stack's, started for the session and stopped after it unless it ran before
    or ``EOS_KEEP_STACK=1`` (or the stack ``EOS_HDFS_STACK_DIR`` names, whose HDFS its
    starter stops). Sets ``EOS_WEBHDFS_URL`` for the sinks' checkpoint records:
    a Spark session started after this fixture passes it to its Python workers."""
    explicit = os.environ.get("EOS_HDFS_URL")
    if explicit:
        yield explicit
        return
    from eos_connectors.dev.stack import Stack

    # EOS_HDFS_STACK_DIR: the stack scripts/test.sh is starting HDFS in (while the first
    # tests run); up_hdfs waits on its lock and finds it running, and it stays up.
    shared = os.environ.get("EOS_HDFS_STACK_DIR")
    stack = Stack(Path(shared)) if shared else Stack()
    was_up = bool(shared) or stack.hdfs_url() is not None
    url = stack.up_hdfs()
    os.environ["EOS_HDFS_URL"] = url
    os.environ["EOS_WEBHDFS_URL"] = stack.webhdfs_url() or ""
    yield url
    if not was_up and not os.environ.get("EOS_KEEP_STACK"):
        stack.down_hdfs()


@pytest.fixture(scope="session")
def spark(endpoints: Endpoints, request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """The session's local Spark; HDFS first when a selected test keeps its checkpoint
    there (the JVM, and so its Python workers, must start with EOS_WEBHDFS_URL set)."""
    from eos_connectors.ops.session import local_session

    if any(item.get_closest_marker("hdfs") for item in request.session.items):
        request.getfixturevalue("hdfs_url")
    session = local_session("eos-tests")
    yield session
    session.stop()


@pytest.fixture
def sasl(endpoints: Endpoints) -> KafkaSasl:
    if endpoints.kafka_sasl is None:
        pytest.skip("these services have no SASL listener; `eos stack up` starts one")
    return endpoints.kafka_sasl
