"""``eos bench``: throughput of the package's connectors against their baselines, in one run.

Figures are reported as ratios to a baseline measured in the same run on the
same topic, never as a lone absolute time.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.topics import create_topic
from eos_connectors.dev.endpoints import Endpoints

PARTITIONS = 4
VALUE_BYTES = 100
KEYS = 100_000  # distinct record keys


@dataclass(frozen=True)
class Measurement:
    name: str
    records: int
    seconds: float
    group: str = ""  # ratios compare a measurement with the first of its group

    @property
    def rate(self) -> float:
        return self.records / self.seconds


def fill_topic(bootstrap: str, topic: str, records: int, keys: int = KEYS) -> None:
    """``records`` records of about 100 bytes over ``keys`` keys, spread over the partitions."""
    create_topic(plaintext(bootstrap), topic, PARTITIONS)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1_000_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 1_000_000,
        }
    )
    payload = os.urandom(VALUE_BYTES // 2).hex().encode()[:VALUE_BYTES]
    for i in range(records):
        key = b"key-%08d" % (i % keys)
        while True:
            try:
                producer.produce(topic, value=payload, key=key)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 50_000 == 0:
            producer.poll(0)
    producer.flush(120)


def raw_consume(bootstrap: str, topic: str, records: int) -> Measurement:
    """The floor: a plain read_committed consume loop in Python touching every value."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-raw-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen = 0
    size = 0
    began = time.perf_counter()
    while seen < records:
        for message in consumer.consume(20_000, 1.0):
            if message.error() is None:
                seen += 1
                size += len(message.value() or b"")
    seconds = time.perf_counter() - began
    consumer.close()
    return Measurement("raw confluent-kafka consume loop", seen, seconds)


def spark_source(bootstrap: str, topic: str, records: int) -> list[Measurement]:
    """The eos_kafka source read into Spark's no-op sink, after a warm-up run.

    Two figures: the micro-batches' own time (Spark's ``triggerExecution``, the
    analogue of the raw loop, which also leaves client set-up out) and the
    query's wall time including start, offset resolution and stop.
    """
    from eos_connectors.ops.session import local_session

    spark = local_session("eos-bench")
    sink = SinkSpec("noop", {})
    _spark_run(spark, bootstrap, topic, sink)  # warm-up: JVM, Python workers, first plans
    began = time.perf_counter()
    rows, batch_ms = _spark_run(spark, bootstrap, topic, sink)
    wall = time.perf_counter() - began
    spark.stop()
    _check_rows("eos_kafka", rows, records)
    return [
        Measurement("eos_kafka source, batch time", rows, batch_ms / 1000),
        Measurement("eos_kafka source, query wall time", rows, wall),
    ]


def postgres_sink(bootstrap: str, topic: str, records: int) -> list[Measurement]:
    """Every record's (word, partition, offset) appended to PostgreSQL with COPY:
    committed plainly by each task (at-least-once), then through prepared
    transactions committed by the driver (exactly-once). Batch time, same run."""
    from eos_connectors.ops.session import local_session

    dsn = bench_endpoints().postgres_dsn
    spark = local_session("eos-bench")
    measured = []
    for guarantee in ("at-least-once", "exactly-once", "at-least-once", "exactly-once"):
        table = f"bench_{guarantee.replace('-', '_')}_{uuid.uuid4().hex[:8]}"
        options = {
            "dsn": dsn,
            "table": table,
            "mode": "append",
            "createTable": "true",
            "deliveryGuarantee": guarantee,
        }
        rows, batch_ms = _spark_run(spark, bootstrap, topic, SinkSpec("eos_postgres", options))
        _check_rows("eos_postgres", rows, records)
        _check_rows(f"table {table}", _table_rows(dsn, table), records)
        measured.append(Measurement(f"eos_postgres {guarantee}", rows, batch_ms / 1000))
    spark.stop()
    return measured[2:]  # the first pair warmed up the JVM, workers and the server


def _table_rows(dsn: str, table: str) -> int:
    import psycopg
    from psycopg import sql

    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
        count = row.fetchone()
        conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(table)))
    return int(count[0]) if count else 0


def kafka_sink(bootstrap: str, topic: str, records: int) -> list[Measurement]:
    """Every record copied to a new topic by the eos_kafka sink: an idempotent producer
    per task (at-least-once), then one transaction per task with its progress marker
    (exactly-once). Batch time, same run, after a warm-up pair."""
    from eos_connectors.ops.session import local_session

    spark = local_session("eos-bench")
    measured = []
    for guarantee in GUARANTEES * 2:
        out = f"{topic}-{guarantee}-{uuid.uuid4().hex[:6]}"
        create_topic(plaintext(bootstrap), out, PARTITIONS)
        options = {
            "kafka.bootstrap.servers": bootstrap,
            "topic": out,
            "deliveryGuarantee": guarantee,
        }
        spec = SinkSpec("eos_kafka", options, ("key", "value"))
        rows, batch_ms = _spark_run(spark, bootstrap, topic, spec)
        _check_rows("eos_kafka sink", rows, records)
        _check_rows(f"topic {out}", _topic_records(bootstrap, out), records)
        measured.append(Measurement(f"eos_kafka sink {guarantee}", rows, batch_ms / 1000))
    measured += [_stateful_kafka(spark, bootstrap, topic, records, g) for g in GUARANTEES]
    spark.stop()
    return measured[2:]


GUARANTEES = ("at-least-once", "exactly-once")


def redis_sink(bootstrap: str, topic: str, records: int) -> list[Measurement]:
    """Every record written to Redis by the eos_redis sink, straight from each task
    (at-least-once: the apply script fed by the task) and staged by tasks then applied
    by the driver's script (exactly-once). Upsert: one SET per record; increment:
    INCRBY of each task's per-key sums. Batch time, same run, after a warm-up pair."""
    import redis

    from eos_connectors.ops.session import local_session

    url = bench_endpoints().redis_url
    client = redis.Redis.from_url(url)
    spark = local_session("eos-bench")
    measured = []
    modes = (("upsert", "CAST(value AS STRING) AS v"), ("increment", "1 AS v"))
    for mode, value in (modes[0], *modes):
        for guarantee in GUARANTEES:
            prefix = f"bench:{uuid.uuid4().hex[:8]}:"
            options = {
                "url": url,
                "keyColumn": "k",
                "valueColumns": "v",
                "mode": mode,
                "keyPrefix": prefix,
                "deliveryGuarantee": guarantee,
            }
            spec = SinkSpec("eos_redis", options, ("CAST(key AS STRING) AS k", value))
            rows, batch_ms = _spark_run(spark, bootstrap, topic, spec)
            _check_rows("eos_redis sink", rows, records)
            _check_redis(client, prefix, mode, records)
            name = f"eos_redis {mode} {guarantee}"
            measured.append(Measurement(name, rows, batch_ms / 1000, mode))
    spark.stop()
    return measured[2:]


def _check_redis(client: object, prefix: str, mode: str, records: int) -> None:
    """Every key is there (and in increment mode the counters add up); then drop them."""
    import redis

    assert isinstance(client, redis.Redis)
    keys = list(client.scan_iter(f"{prefix}*", count=10_000))
    if mode == "increment":
        total = sum(int(v or 0) for v in client.mget(keys)) if keys else 0
        _check_rows(f"counters under {prefix}", total, records)
    elif len(keys) != min(records, KEYS):
        raise AssertionError(f"{len(keys)} keys under {prefix}, expected {min(records, KEYS)}")
    for start in range(0, len(keys), 10_000):
        client.delete(*keys[start : start + 10_000])


def _stateful_kafka(
    spark: object, bootstrap: str, topic: str, records: int, guarantee: str
) -> Measurement:
    """Kafka -> keyed count (100,000 keys, complete mode) -> Kafka, 1 s trigger,
    250,000 offsets per batch: input records per second of wall time until all
    input is processed, start included."""
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    out = f"{topic}-counts-{guarantee}-{uuid.uuid4().hex[:6]}"
    create_topic(plaintext(bootstrap), out, PARTITIONS)
    counts = (
        spark.readStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "250000")
        .load()
        .groupBy("key")
        .count()
        .selectExpr("key", "CAST(CAST(count AS STRING) AS BINARY) AS value")
    )
    with tempfile.TemporaryDirectory(prefix="eos-bench-") as checkpoint:
        began = time.perf_counter()
        query = (
            counts.writeStream.format("eos_kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", out)
            .option("deliveryGuarantee", guarantee)
            .outputMode("complete")
            .option("checkpointLocation", checkpoint)
            .trigger(processingTime="1 second")
            .start()
        )
        query.processAllAvailable()
        seconds = time.perf_counter() - began
        query.stop()
        rows = sum(int(p["numInputRows"]) for p in query.recentProgress)
    _check_rows("stateful eos_kafka pipeline", rows, records)
    return Measurement(f"Kafka->count->Kafka {guarantee}", rows, seconds, "stateful")


def _topic_records(bootstrap: str, topic: str) -> int:
    """Records a read_committed reader sees, counted by reading up to the end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    ends = {
        p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1]
        for p in range(PARTITIONS)
    }
    seen = 0
    while any(
        (tp.offset or 0) < ends[tp.partition]
        for tp in consumer.position([TopicPartition(topic, p) for p in ends])
    ):
        seen += sum(1 for m in consumer.consume(50_000, 1.0) if m.error() is None)
    consumer.close()
    return seen


@dataclass(frozen=True)
class SinkSpec:
    format: str
    options: dict[str, str]
    select: tuple[str, ...] = ("CAST(key AS STRING) AS word", "partition", "offset")


def _check_rows(what: str, rows: int, records: int) -> None:
    if rows != records:
        raise AssertionError(f"{what} processed {rows} records, expected {records}")


def _spark_run(spark: object, bootstrap: str, topic: str, sink: SinkSpec) -> tuple[int, int]:
    """Run one availableNow query; return rows read and the data batches' time in ms."""
    from pyspark.sql import SparkSession

    assert isinstance(spark, SparkSession)
    stream = (
        spark.readStream.format("eos_kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    if sink.format != "noop":
        stream = stream.selectExpr(*sink.select)
    with tempfile.TemporaryDirectory(prefix="eos-bench-") as checkpoint:
        writer = stream.writeStream.format(sink.format).option("checkpointLocation", checkpoint)
        for key, value in sink.options.items():
            writer = writer.option(key, value)
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        batches = [p for p in query.recentProgress if p["numInputRows"]]
        rows = sum(int(p["numInputRows"]) for p in batches)
        return rows, sum(int(p["durationMs"]["triggerExecution"]) for p in batches)


def bench_endpoints() -> Endpoints:
    endpoints = Endpoints.from_env()
    if endpoints is None:
        from eos_connectors.dev.stack import Stack

        endpoints = Stack().up()
    return endpoints


def _as_list(result: Measurement | list[Measurement]) -> list[Measurement]:
    return result if isinstance(result, list) else [result]


Bench = Callable[[str, str, int], "Measurement | list[Measurement]"]
BENCHES: dict[str, tuple[Bench, ...]] = {
    "source": (raw_consume, spark_source),
    "postgres": (postgres_sink,),
    "kafka": (kafka_sink,),
    "redis": (redis_sink,),
}


def run_bench(which: str, records: int, out_dir: Path) -> int:
    endpoints = bench_endpoints()
    topic = f"eos-bench-{which}-{uuid.uuid4().hex[:8]}"
    print(f"Writing {records:,} records of ~{VALUE_BYTES} bytes to {topic}...", flush=True)
    fill_topic(endpoints.kafka_bootstrap, topic, records)
    measured = [
        m
        for bench in BENCHES[which]
        for m in _as_list(bench(endpoints.kafka_bootstrap, topic, records))
    ]
    print(_table(measured))
    out_dir.mkdir(parents=True, exist_ok=True)
    report = {
        "bench": which,
        "records": records,
        "cores": os.cpu_count(),
        "results": [asdict(m) | {"rate": m.rate, "ratio": r} for m, r in _ratios(measured)],
    }
    (out_dir / f"{which}.json").write_text(json.dumps(report, indent=2))
    return 0


def _ratios(measured: list[Measurement]) -> list[tuple[Measurement, float]]:
    baselines: dict[str, Measurement] = {}
    for m in measured:
        baselines.setdefault(m.group, m)
    return [(m, m.rate / baselines[m.group].rate) for m in measured]


def _table(measured: list[Measurement]) -> str:
    lines = [
        f"| {'pipeline':<40} | {'records/s':>12} | {'ratio':>6} |",
        f"|{'-' * 42}|{'-' * 14}|{'-' * 8}|",
    ]
    for m, ratio in _ratios(measured):
        lines.append(f"| {m.name:<40} | {m.rate:>12,.0f} | {ratio:>5.2f}x |")
    return "\n".join(lines)
