"""A batch job run as its own OS process by crash tests: one eos_kafka batch read of a
topic's committed records, written by ``df.write`` into eos_kafka, eos_postgres
(append) and eos_redis (increment), each as version ``--version`` of its own job.

A write that fails (a task or the commit killed at a fault point) is run again in the
same process, the way a scheduler's retry would run the job again, up to
``--attempts`` times; a kill of the whole process is rerun by the test.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out-topic", required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--table", required=True)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--prefix", required=True, help="sink ids and Redis keys start with it")
    parser.add_argument("--version", required=True)
    parser.add_argument("--attempts", type=int, default=8)
    args = parser.parse_args()
    os.environ["EOS_FAULT_PGID"] = str(os.getpgid(0))

    from eos_connectors.ops.session import local_session

    spark = local_session("batch-job")
    run(spark, Job(args.bootstrap, args.topic, args.out_topic, args.dsn, args.table,
                   args.redis_url, args.prefix, args.version), args.attempts)  # fmt: skip
    spark.stop()


@dataclass(frozen=True)
class Job:
    bootstrap: str
    topic: str
    out_topic: str
    dsn: str
    table: str
    redis_url: str
    prefix: str  # sink ids and Redis keys start with it
    version: str


def run(spark: Any, job: Job, attempts: int = 8) -> None:
    """The job in ``spark``: a process of its own for a crash test, the test session's
    Spark for a run that is not crashed."""
    records = (
        spark.read.format("eos_kafka")
        .option("kafka.bootstrap.servers", job.bootstrap)
        .option("subscribe", job.topic)
        .load()
        .selectExpr("key", "value", "CAST(value AS STRING) AS id", "CAST(key AS STRING) AS k")
    )
    writes: list[tuple[str, Any, dict[str, str]]] = [
        (
            "eos_kafka",
            records.select("key", "value"),
            {"kafka.bootstrap.servers": job.bootstrap, "topic": job.out_topic},
        ),
        (
            "eos_postgres",
            records.select("id"),
            {"dsn": job.dsn, "table": job.table, "createTable": "true"},
        ),
        (
            "eos_redis",
            records.selectExpr("k", "1 AS n"),
            {
                "url": job.redis_url,
                "keyColumn": "k",
                "valueColumns": "n",
                "mode": "increment",
                "keyPrefix": f"{job.prefix}:",
            },
        ),
    ]
    for fmt, df, options in writes:
        named = {"sinkId": f"{job.prefix}-{fmt}", "txnVersion": job.version}
        write(df, fmt, {**options, **named}, attempts)


def write(df: Any, fmt: str, options: dict[str, str], attempts: int) -> None:
    """``df.write`` into ``fmt``, run again after a failure, at most ``attempts`` times."""
    for attempt in range(1, attempts + 1):
        try:
            df.write.format(fmt).options(**options).mode("append").save()
            return
        except Exception as exc:  # a killed task or commit fails the job: run it again
            print(f"{fmt}: attempt {attempt} failed: {str(exc).splitlines()[0][:200]}", flush=True)
    raise SystemExit(f"{fmt}: still failing after {attempts} attempts")


if __name__ == "__main__":
    main()
