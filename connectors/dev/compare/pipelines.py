"""The pipelines ``eos bench`` compares: one keyed count, five ways to run it.

Every pipeline reads the same keyed input topic, keeps a running count per key
and publishes each changed key's new count to its sink, so every sink ends
holding the same counts and one reader checks them all.
"""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from eos_connectors.core.topics import create_topic
from eos_connectors.dev.compare import readers
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness.spec import PipelineSpec, QuerySpec
from eos_connectors.ops.cache import cache_root

#: Quix Streams' own virtualenv (it pins an older confluent-kafka): ``EOS_QUIX_PYTHON``,
#: else one in the package's cache, made on first use.
QUIX_PYTHON = Path(os.environ.get("EOS_QUIX_PYTHON", cache_root() / "venv-quix" / "bin" / "python"))
PARTITIONS = 4
#: local[CORES]: the Spark pipelines' task slots. eos_kafka reads with maxPartitions=CORES:
#: a Python task costs Spark ~80 ms more than a JVM one, so the four input partitions'
#: ranges are read by two tasks in one wave instead of four in two.
CORES = 2


@dataclass(frozen=True)
class Pipeline:
    key: str  # the command line's name for it
    label: str  # the report's
    engine: str  # eos | spark | quix | raw
    sink: str  # kafka | postgres | redis
    guarantee: str  # exactly-once | at-least-once
    #: A change stream: each changed key's count, deleted when it is 3 modulo 5 (a fifth
    #: of the rows are deletes), into PostgreSQL upsert with deletes. Throughput only:
    #: a deleted key is missing from what a latency watcher sees.
    changes: bool = False

    @property
    def spark(self) -> bool:
        return self.engine in ("eos", "spark")

    @property
    def cores(self) -> int:
        """Cores it computes on: Spark's task slots, or one process's one core."""
        return CORES if self.spark else 1

    @property
    def reference(self) -> bool:
        """Shown for reference (no target is judged on it): Quix and the raw loop."""
        return not self.spark


PIPELINES = (
    Pipeline("eos-kafka", "eos_kafka -> count -> eos_kafka", "eos", "kafka", "exactly-once"),
    Pipeline(
        "eos-postgres", "eos_kafka -> count -> eos_postgres", "eos", "postgres", "exactly-once"
    ),
    Pipeline("eos-redis", "eos_kafka -> count -> eos_redis", "eos", "redis", "exactly-once"),
    Pipeline("eos-kafka-alo", "eos_kafka -> count -> eos_kafka", "eos", "kafka", "at-least-once"),
    Pipeline(
        "eos-postgres-alo", "eos_kafka -> count -> eos_postgres", "eos", "postgres", "at-least-once"
    ),
    Pipeline("eos-redis-alo", "eos_kafka -> count -> eos_redis", "eos", "redis", "at-least-once"),
    Pipeline(
        "eos-pg-changes",
        "eos_kafka -> count -> eos_postgres, 20% deletes",
        "eos",
        "postgres",
        "exactly-once",
        changes=True,
    ),
    Pipeline(
        "eos-pg-changes-alo",
        "eos_kafka -> count -> eos_postgres, 20% deletes",
        "eos",
        "postgres",
        "at-least-once",
        changes=True,
    ),
    Pipeline(
        "spark-kafka", "Spark kafka -> count -> Spark kafka", "spark", "kafka", "at-least-once"
    ),
    Pipeline("quix", "Quix Streams count", "quix", "kafka", "exactly-once"),
    Pipeline("raw", "raw confluent-kafka transactional loop", "raw", "kafka", "exactly-once"),
)
BY_KEY = {p.key: p for p in PIPELINES}
#: The order of a round (odd rounds; even rounds run it backwards): the two pipelines of
#: each pair the targets compare run next to each other, so a drift of the machine over
#: a round falls on both alike, and backwards the next round, so that what runs second
#: in one round runs first in the next (ABBA).
ORDER = (
    "spark-kafka",
    "eos-kafka",
    "eos-kafka-alo",
    "eos-postgres",
    "eos-postgres-alo",
    "eos-pg-changes",
    "eos-pg-changes-alo",
    "eos-redis",
    "eos-redis-alo",
    "quix",
    "raw",
)
#: (pipeline, baseline) of every records/s target: the rounds go on until each ratio's
#: 95% interval is narrow enough.
PAIRS = (
    ("eos-kafka", "spark-kafka"),
    ("eos-kafka", "eos-kafka-alo"),
    ("eos-postgres", "eos-postgres-alo"),
    ("eos-redis", "eos-redis-alo"),
    ("eos-pg-changes", "eos-pg-changes-alo"),
)
#: A change-stream pipeline deletes a key whose count is this modulo 5.
DELETED_REMAINDER = 3


@dataclass(frozen=True)
class Target:
    """One run's input, output (topic, table or key prefix) and state directory."""

    pipeline: Pipeline
    source: str
    run_id: str
    state_dir: Path

    @property
    def output(self) -> str:
        if self.pipeline.sink == "postgres":
            return f"bench_{self.run_id}"
        if self.pipeline.sink == "redis":
            return f"bench:{self.run_id}:"
        return f"eos-bench-out-{self.run_id}"

    @property
    def commit_times(self) -> Path:
        return self.state_dir / "commit-times.jsonl"


def new_target(pipeline: Pipeline, source: str, endpoints: Endpoints, root: Path) -> Target:
    run_id = uuid.uuid4().hex[:10]
    target = Target(pipeline, source, run_id, root / f"{pipeline.key}-{run_id}")
    target.state_dir.mkdir(parents=True)
    if pipeline.sink == "kafka":
        create_topic(endpoints.kafka, target.output, PARTITIONS)
    return target


def command(target: Target, endpoints: Endpoints, max_offsets: int) -> list[str]:
    """The pipeline's command line; Spark reads at most ``max_offsets`` records a batch."""
    pipeline = target.pipeline
    bootstrap = endpoints.kafka_bootstrap
    if pipeline.engine == "quix":
        script = str(Path(__file__).with_name("quix_app.py"))
        group = f"eos-bench-quix-{target.run_id}"
        return [
            str(QUIX_PYTHON),
            script,
            bootstrap,
            target.source,
            target.output,
            group,
            str(target.state_dir / "quix-state"),
        ]
    if pipeline.engine == "raw":
        return [
            sys.executable,
            "-m",
            "eos_connectors.dev.compare.raw_loop",
            bootstrap,
            target.source,
            target.output,
            f"eos-bench-raw-{target.run_id}",
        ]
    spec = PipelineSpec(
        bootstrap=bootstrap,
        checkpoint=str(target.state_dir / "checkpoint"),
        queries=(_query(target, endpoints),),
        max_offsets=max_offsets,
        trigger="continuous",
        every="0 seconds",
        cores=CORES,
        conf=_connector_conf(pipeline.engine),
        events=True,
        app=f"eos-bench-{pipeline.key}",
    ).write(target.state_dir / "pipeline.json")
    return [sys.executable, "-m", "eos_connectors.dev.harness.pipeline", str(spec)]


def _query(target: Target, endpoints: Endpoints) -> QuerySpec:
    """key -> groupBy count (complete mode) -> the sink; Spark's own kafka source and sink
    for the JVM connector."""
    pipeline = target.pipeline
    source = "eos_kafka" if pipeline.engine == "eos" else "kafka"
    packed = {"maxPartitions": str(CORES)} if pipeline.engine == "eos" else {}
    guarantee = (
        {}
        if pipeline.engine == "spark"
        else {"deliveryGuarantee": pipeline.guarantee, "sinkId": f"bench-{target.run_id}"}
    )
    if pipeline.sink == "kafka":
        columns = ("CAST(word AS BINARY) AS key", "CAST(CAST(count AS STRING) AS BINARY) AS value")
        options = {"kafka.bootstrap.servers": endpoints.kafka_bootstrap, "topic": target.output}
        fmt = "eos_kafka" if pipeline.engine == "eos" else "kafka"
        return QuerySpec(
            "bench", target.source, "count", fmt, columns, {**options, **guarantee}, source, packed
        )
    if pipeline.sink == "postgres":
        options = {
            "dsn": endpoints.postgres_dsn,
            "table": target.output,
            "mode": "upsert",
            "keyColumns": "word",
            "createTable": "true",
        }
        written: tuple[str, ...] = ("word", "count")
        if pipeline.changes:
            op = f"CASE WHEN count % 5 = {DELETED_REMAINDER} THEN 'd' ELSE 'u' END AS op"
            written = (*written, op)
            options = {**options, "deleteColumn": "op", "deleteValue": "d"}
        return QuerySpec(
            "bench",
            target.source,
            "count",
            "eos_postgres",
            written,
            {**options, **guarantee},
            source,
            packed,
        )
    options = {
        "url": endpoints.redis_url,
        "keyColumn": "word",
        "valueColumns": "count",
        "keyPrefix": target.output,
    }
    return QuerySpec(
        "bench",
        target.source,
        "count",
        "eos_redis",
        ("word", "count"),
        {**options, **guarantee},
        source,
        packed,
    )


def _connector_conf(engine: str) -> dict[str, str]:
    if engine == "eos":
        return {}
    from eos_connectors.dev.compare.jars import spark_kafka_jars

    return {"spark.jars": ",".join(str(jar) for jar in spark_kafka_jars())}


def expected_visible(records: int, keys: int, changes: bool) -> int:
    """What the sink's counts add up to once every record is counted: ``fill_topic``
    writes the keys round-robin, so key i ends at ``records // keys`` (+1 for the first
    ``records % keys``); a change-stream pipeline deleted the keys that end at
    :data:`DELETED_REMAINDER` modulo 5."""
    ends = [records // keys + (1 if i < records % keys else 0) for i in range(keys)]
    return sum(c for c in ends if not changes or c % 5 != DELETED_REMAINDER)


def visible_counts(target: Target, endpoints: Endpoints) -> dict[str, int]:
    """What a reader of the sink sees now: each key's count."""
    if target.pipeline.sink == "postgres":
        return readers.postgres_counts(endpoints.postgres_dsn, target.output)
    if target.pipeline.sink == "redis":
        return readers.redis_counts(endpoints.redis_url, target.output)
    counts = readers.kafka_counts(endpoints.kafka_bootstrap, target.output)
    return {key.decode(): count for key, count in counts.items()}


def watcher(target: Target, endpoints: Endpoints, keys: list[str]) -> readers.Watcher:
    if target.pipeline.sink == "postgres":
        return readers.PostgresWatcher(endpoints.postgres_dsn, target.output)
    if target.pipeline.sink == "redis":
        return readers.RedisWatcher(endpoints.redis_url, target.output, keys)
    return readers.KafkaWatcher(endpoints.kafka_bootstrap, target.output)


def clean_up(target: Target, endpoints: Endpoints) -> None:
    """Drop the run's output so repeated benchmarks do not fill the services."""
    if target.pipeline.sink == "postgres":
        import psycopg
        from psycopg import sql

        with psycopg.connect(endpoints.postgres_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(target.output)))
    elif target.pipeline.sink == "redis":
        import redis

        client = redis.Redis.from_url(endpoints.redis_url)
        keys = list(client.scan_iter(f"{target.output}*", count=10_000))
        for start in range(0, len(keys), 10_000):
            client.delete(*keys[start : start + 10_000])
        client.close()
    else:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
        for future in admin.delete_topics([target.output]).values():
            future.result(30)
