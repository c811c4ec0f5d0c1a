"""The eos_redis sink through crashes, a Redis crash and bad input, on real Redis and Kafka.

Pipeline (its own process): eos_kafka -> transformWithStateInPandas running count
-> eos_redis. In increment mode the sink adds each batch's per-word delta to a
counter, so a batch applied twice would show as a counter above the input's
count; in upsert mode it sets the running count. Exactly once means: every
counter equals the count computed from the input, and no stage is left behind.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from pyspark.sql import SparkSession

from connectors.endpoints import Endpoints
from connectors.faults import POINTS
from connectors.harness.data import create_topic, produce_words
from tests.pipeline_util import (
    env,
    fault_schedule,
    kill_when,
    pipeline_command,
    progress_after,
    run,
)
from tests.sink_util import stream_into

pytestmark = [pytest.mark.services, pytest.mark.spark]

RECORDS = 4000
PER_BATCH = "200"  # 20 batches: room for 15 scheduled crashes


@pytest.fixture
def client(endpoints: Endpoints) -> redis.Redis:
    return redis.Redis.from_url(endpoints.redis_url)


def _setup(endpoints: Endpoints, unique: str) -> tuple[str, Counter[str]]:
    topic = f"rs-in-{unique}"
    create_topic(endpoints.kafka_bootstrap, topic, partitions=3)
    return topic, produce_words(endpoints.kafka_bootstrap, topic, RECORDS, seed=len(unique))


def _command(topic: str, tmp_path: Path, mode: str, trigger: str = "available-now") -> list[str]:
    return pipeline_command(
        "--topic", topic, "--checkpoint", str(tmp_path / "checkpoint"), "--sink", "redis",
        "--state", "processor", "--redis-mode", mode, "--key-prefix", f"{topic}:",
        "--trigger", trigger, "--max-offsets", PER_BATCH,
    )  # fmt: skip


def _check(client: redis.Redis, topic: str, expected: Counter[str]) -> None:
    prefix = f"{topic}:"
    counters = {
        key.decode().removeprefix(prefix): int(client.get(key) or 0)
        for key in client.scan_iter(f"{prefix}*")
    }
    assert counters == dict(expected), "a counter differs from the input's count"
    assert list(client.scan_iter("eos:{*}:stage:*")) == [], "a stage was left behind"
    assert all(client.scard(k) == 0 for k in client.scan_iter("eos:{*}:units"))


def _run_through(command: list[str], schedule: str, markers: Path, crashes: int) -> None:
    """Restart the pipeline until it finishes; every scheduled crash must have fired."""
    fault = env(EOS_FAULT_POINT=schedule, EOS_FAULT_SCOPE="group", EOS_FAULT_MARKER=str(markers))
    for _ in range(crashes + 3):
        if run(command, fault) == 0:
            break
    fired = sorted(p.name for p in markers.iterdir()) if markers.exists() else []
    assert len(fired) == crashes, f"fired {fired}, scheduled {schedule}"
    assert run(command, env()) == 0  # nothing left to do, and it still succeeds


@pytest.mark.parametrize(
    ("mode", "rounds", "first_batch"),
    [("increment", 3, 1), ("upsert", 1, 2)],
    ids=["increment-every-point-3-times", "upsert-every-point-once"],
)
def test_through_every_fault_point(
    client: redis.Redis, endpoints: Endpoints, unique: str, tmp_path: Path,
    mode: str, rounds: int, first_batch: int,
) -> None:  # fmt: skip
    """Increment mode is where a replayed batch would show (a counter above the input's
    count): every point three times. Upsert rewrites the same values: once each."""
    topic, expected = _setup(endpoints, unique)
    schedule = fault_schedule(list(POINTS), times=rounds, first_batch=first_batch)
    crashes = len(POINTS) * rounds
    _run_through(_command(topic, tmp_path, mode), schedule, tmp_path / "fired", crashes)
    _check(client, topic, expected)


def test_increment_through_random_kills(
    client: redis.Redis, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic, expected = _setup(endpoints, unique)
    rng = random.Random(unique)
    for _ in range(3):
        command = _command(topic, tmp_path, "increment", "continuous")
        kill_when(command, env(), progress_after(tmp_path / "checkpoint"), rng.uniform(0, 3))
    assert run(_command(topic, tmp_path, "increment"), env()) == 0
    _check(client, topic, expected)


def test_a_redis_crash_mid_stream_loses_nothing(
    client: redis.Redis,
    endpoints: Endpoints,
    unique: str,
    tmp_path: Path,
    crash_service: Callable[[str], None],
) -> None:
    """SIGKILL Redis (AOF, fsync always) while the query runs; restart both; count."""
    topic, expected = _setup(endpoints, unique)
    command = _command(topic, tmp_path, "increment", "continuous")
    checkpoint = tmp_path / "checkpoint"
    ready = progress_after(checkpoint)
    kill_when(command, env(), ready, delay=8, on_ready=lambda: crash_service("redis"))
    for _ in range(3):  # the query may or may not survive Redis's absence; finish it
        if run(_command(topic, tmp_path, "increment"), env()) == 0:
            break
    _check(client, topic, expected)


def _write(spark: SparkSession, endpoints: Endpoints, topic: str, tmp_path: Path,
           select: list[str], **options: str) -> None:  # fmt: skip
    sink = {"url": endpoints.redis_url, "keyPrefix": f"{topic}:", **options}
    stream_into(spark, endpoints, topic, tmp_path, select, "eos_redis", **sink)


def test_bad_input_gets_clear_errors_and_writes_nothing(
    spark: SparkSession, client: redis.Redis, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic, _ = _setup(endpoints, unique)
    words = ["CAST(key AS STRING) AS word", "1 AS n", "CAST(value AS STRING) AS text"]
    with pytest.raises(Exception, match="Option 'keyColumn' names column 'missing'"):
        _write(spark, endpoints, topic, tmp_path / "a", words,
               keyColumn="missing", valueColumns="n", mode="increment")  # fmt: skip
    with pytest.raises(Exception, match="adds values to counters, but column 'text'"):
        _write(spark, endpoints, topic, tmp_path / "b", words,
               keyColumn="word", valueColumns="text", mode="increment")  # fmt: skip
    nulls = ["CASE WHEN offset % 7 = 3 THEN NULL ELSE CAST(key AS STRING) END AS word", "1 AS n"]
    with pytest.raises(Exception, match=r"Column 'word' \(option keyColumn\) is null"):
        _write(spark, endpoints, topic, tmp_path / "c", nulls,
               keyColumn="word", valueColumns="n", mode="increment")  # fmt: skip
    assert list(client.scan_iter(f"{topic}:*")) == []
    assert list(client.scan_iter("eos:{*}:stage:*")) == []


def test_an_unreachable_server_is_named_without_its_password(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic, _ = _setup(endpoints, unique)
    url = "redis://:hunter2secret@127.0.0.1:1/0"
    with pytest.raises(Exception, match=r"Redis at redis://:\*\*\*@127\.0\.0\.1:1/0") as info:
        _write(spark, endpoints, topic, tmp_path, ["CAST(key AS STRING) AS k", "1 AS n"],
               url=url, keyColumn="k", valueColumns="n")  # fmt: skip
    assert "hunter2secret" not in str(info.value)
