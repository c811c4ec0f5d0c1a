"""The eos_redis sink refuses bad input and names an unreachable server without its password.

Its exactly-once behaviour through crashes is proven by the contract suite
(tests/services/test_contract.py) and the conformance cells
(tests/system/test_conformance.py)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import redis
from pyspark.sql import SparkSession

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness.data import produce_words
from tests.sink_util import stream_into

pytestmark = [pytest.mark.services, pytest.mark.spark]


@pytest.fixture
def client(endpoints: Endpoints) -> redis.Redis:
    return redis.Redis.from_url(endpoints.redis_url)


def _setup(endpoints: Endpoints, unique: str) -> tuple[str, Counter[str]]:
    topic = f"rs-in-{unique}"
    create_topic(endpoints.kafka, topic, partitions=3)
    return topic, produce_words(endpoints.kafka_bootstrap, topic, 500, seed=len(unique))


def _write(
    spark: SparkSession,
    endpoints: Endpoints,
    topic: str,
    tmp_path: Path,
    select: list[str],
    **options: str,
) -> None:
    sink = {"url": endpoints.redis_url, "keyPrefix": f"{topic}:", **options}
    stream_into(spark, endpoints, topic, tmp_path, select, "eos_redis", **sink)


@pytest.mark.cost(5)
def test_bad_input_gets_clear_errors_and_writes_nothing(
    spark: SparkSession, client: redis.Redis, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic, _ = _setup(endpoints, unique)
    stages_before = set(client.scan_iter("eos:{*}:stage:*"))  # other runs' are theirs
    words = ["CAST(key AS STRING) AS word", "1 AS n", "CAST(value AS STRING) AS text"]
    with pytest.raises(Exception, match="Option 'keyColumn' names column 'missing'"):
        _write(
            spark,
            endpoints,
            topic,
            tmp_path / "a",
            words,
            keyColumn="missing",
            valueColumns="n",
            mode="increment",
        )
    with pytest.raises(Exception, match="adds values to counters, but column 'text'"):
        _write(
            spark,
            endpoints,
            topic,
            tmp_path / "b",
            words,
            keyColumn="word",
            valueColumns="text",
            mode="increment",
        )
    nulls = ["CASE WHEN offset % 7 = 3 THEN NULL ELSE CAST(key AS STRING) END AS word", "1 AS n"]
    with pytest.raises(Exception, match=r"Column 'word' \(option keyColumn\) is null"):
        _write(
            spark,
            endpoints,
            topic,
            tmp_path / "c",
            nulls,
            keyColumn="word",
            valueColumns="n",
            mode="increment",
        )
    # A data key in the bookkeeping keyspace fails the task the same way (each failing
    # task costs Spark's retries, so that case is proven on values.entries alone:
    # tests/unit/test_redis_sink_values.py).
    assert list(client.scan_iter(f"{topic}:*")) == []
    assert set(client.scan_iter("eos:{*}:stage:*")) - stages_before == set()


def test_an_unreachable_server_is_named_without_its_password(
    spark: SparkSession, endpoints: Endpoints, unique: str, tmp_path: Path
) -> None:
    topic, _ = _setup(endpoints, unique)
    url = "redis://:hunter2secret@127.0.0.1:1/0"
    with pytest.raises(Exception, match=r"Redis at redis://:\*\*\*@127\.0\.0\.1:1/0") as info:
        _write(
            spark,
            endpoints,
            topic,
            tmp_path,
            ["CAST(key AS STRING) AS k", "1 AS n"],
            url=url,
            keyColumn="k",
            valueColumns="n",
        )
    assert "hunter2secret" not in str(info.value)


def test_a_workers_pooled_client_is_reused_and_works_after_its_connection_died(
    endpoints: Endpoints, client: redis.Redis
) -> None:
    """Tasks on one worker share a client; after the server dropped its connection (a
    restart, an idle timeout) the next task still gets a client that answers (the PING
    on taking it reconnects or replaces it)."""
    from eos_connectors.sinks.redis.connection import pooled
    from eos_connectors.sinks.redis.options import parse_options

    options = parse_options({"url": endpoints.redis_url, "keyColumn": "k", "valueColumns": "n"})
    first = pooled(options)
    assert pooled(options) is first
    before = first.client_id()
    assert client.client_kill_filter(_id=str(before)) == 1
    then = pooled(options)
    assert then.set(f"pool-check-{before}", b"1", ex=60)
    assert then.client_id() != before
