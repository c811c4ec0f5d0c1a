"""The package as a user gets it: the wheel alone, installed without extras into a fresh
virtualenv outside the repository, run from a folder of the user's own that has
``sources/``, ``sinks/`` and ``connectors/`` packages of its own.

Second tier (`make full`, ~55 s): run it before a release and whenever packaging changes
(pyproject.toml, package data, the CLI's entry point).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eos_connectors import __version__
from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from tests.kafka_util import produce_plain

pytestmark = [pytest.mark.services, pytest.mark.spark, pytest.mark.full]

ROOT = Path(__file__).resolve().parents[2]
RECORDS = 300

#: Every command and sub-command whose --help must work on a plain install.
HELP = [
    [],
    *[[c] for c in ("stack", "demo", "verify", "sinks", "checkpoint", "savepoint", "state")],
    *[["stack", a] for a in ("up", "down", "status", "env", "restart")],
    *[["sinks", a] for a in ("list", "show", "settle", "reset")],
    ["checkpoint", "inspect"],
    ["checkpoint", "rescale"],
    *[["savepoint", a] for a in ("create", "list", "restore")],
    ["state", "get"],
    *[["bench", b] for b in ("compare", "tasks", "kafka-cpu", "source", "postgres")],
]

JOB = """
import os, sys
from pyspark.sql import SparkSession
from eos_connectors import register

spark = (SparkSession.builder.master("local[2]").appName("wheel-test")
         .config("spark.driver.host", "127.0.0.1").config("spark.ui.enabled", "false")
         .getOrCreate())
register(spark)
query = (spark.readStream.format("eos_kafka")
         .option("kafka.bootstrap.servers", os.environ["EOS_KAFKA_BOOTSTRAP"])
         .option("subscribe", sys.argv[1]).option("startingOffsets", "earliest").load()
         .selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
         .writeStream.format("eos_postgres")
         .option("dsn", os.environ["EOS_POSTGRES_DSN"]).option("table", sys.argv[2])
         .option("createTable", "true")
         .option("checkpointLocation", sys.argv[3]).trigger(availableNow=True).start())
query.awaitTermination()
spark.stop()
"""


def _run(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done  # type: ignore[no-any-return]


@pytest.mark.cost(55)
def test_the_wheel_alone_gives_a_working_cli_and_pipeline(
    endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(tmp_path / "dist"), str(ROOT)])
    (wheel,) = (tmp_path / "dist").glob("eos_connectors-*.whl")
    venv = tmp_path / "venv"
    _run([sys._base_executable, "-m", "venv", str(venv)])  # type: ignore[attr-defined]
    _run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(wheel)])
    eos = str(venv / "bin" / "eos")

    user = tmp_path / "project"  # the user's own folders of the generic names
    for name in ("sources", "sinks", "connectors"):
        (user / name).mkdir(parents=True)
        (user / name / "__init__.py").write_text(f"raise ImportError('the user\\'s own {name}')\n")
    assert _run([eos, "--version"], cwd=user).stdout.strip() == f"eos-connectors {__version__}"
    for command in HELP:
        _run([eos, *command, "--help"], cwd=user)

    topic, table = f"wheel-{unique}", f"wheel_{unique}"
    create_topic(endpoints.kafka, topic, 2)
    produce_plain(endpoints.kafka_bootstrap, topic, [f"v{i}".encode() for i in range(RECORDS)])
    (user / "job.py").write_text(textwrap.dedent(JOB))
    environment = {**os.environ, **endpoints.as_env()}
    environment.pop("PYTHONPATH", None)
    # the virtualenv activated: Spark starts its Python workers as `python3` from PATH
    environment["PATH"] = f"{venv / 'bin'}{os.pathsep}{environment['PATH']}"
    job = [str(venv / "bin" / "python"), "job.py", topic, table, str(tmp_path / "checkpoint")]
    _run(job, cwd=user, env=environment, timeout=600)
    import psycopg

    with psycopg.connect(endpoints.postgres_dsn) as conn:
        row = conn.execute(f'SELECT count(*), count(DISTINCT value) FROM "{table}"').fetchone()
    assert row == (RECORDS, RECORDS)
