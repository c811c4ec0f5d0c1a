"""No secret in anything a Spark process prints: a query whose sinks get wrong passwords, run
as a process of its own so that its whole output, Spark's log at INFO included, is read.

Cost: ~17 s in CI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eos_connectors.dev.endpoints import Endpoints
from tests.services.test_secrets import (
    _leaks,
    _pg_kv,
    _pg_options,
    _pg_url,
    _redis_options,
    _redis_url,
)

pytestmark = [pytest.mark.services, pytest.mark.spark]

SPARK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from eos_connectors.ops.session import local_session

    cases = json.load(open(sys.argv[1]))
    spark = local_session(app="eos-secrets")
    rows = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    words = rows.selectExpr("CAST(value % 3 AS STRING) AS word", "value AS count")
    for name, (fmt, options) in cases.items():
        query = (
            words.writeStream.format(fmt).options(**options)
            .option("checkpointLocation", sys.argv[2] + "/" + name).start()
        )
        try:
            query.awaitTermination(120)
            print("CASE", name, "did not fail", flush=True)
        except Exception as exc:
            print("CASE", name, "failed:", exc, flush=True)
    spark.stop()
    """
)


@pytest.mark.cost(17)
def test_no_secret_in_a_failing_spark_query_or_its_log(
    endpoints: Endpoints, tmp_path: Path
) -> None:
    """A Spark process whose sinks get wrong passwords: its whole output, log included."""
    cases = {
        "postgres": ("eos_postgres", _pg_options(_pg_url(endpoints))),
        "postgres-key-value": ("eos_postgres", _pg_options(_pg_kv(endpoints))),
        "redis-unreachable": ("eos_redis", _redis_options(_redis_url(endpoints, port="1"))),
    }
    options_file = tmp_path / "cases.json"
    options_file.write_text(json.dumps(cases))  # never on the command line
    env = {**os.environ, "EOS_SPARK_LOG_LEVEL": "INFO"}
    done = subprocess.run(
        [sys.executable, "-c", SPARK_SCRIPT, str(options_file), str(tmp_path / "ck")],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    output = done.stdout + done.stderr
    for name in cases:
        assert f"CASE {name} failed:" in output, output[-5000:]
    assert " INFO " in output, "Spark's INFO lines were not printed: the test would see less"
    assert "password authentication failed" in output
    assert "Connection refused" in output
    assert _leaks(output) == [], "the Spark process showed the secret"
