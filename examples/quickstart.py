"""The README's quickstart, runnable as it is: a word count from Kafka into PostgreSQL,
exactly once.

Against the services of ``docker compose up -d`` (the endpoints below), or of
``eos stack up`` after ``eval "$(eos stack env)"`` (its ``EOS_*`` variables win)::

    python examples/quickstart.py

It writes a few words to the topic ``words`` (created when missing), runs the query until
it has read everything (``availableNow``), and prints the table. Run it again: the new
words are counted once more, the old ones are not counted twice (the checkpoint, in
``eos-quickstart`` under the temporary directory, remembers where the query stopped).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from psycopg import sql
from pyspark.sql import SparkSession

from eos_connectors import register

KAFKA = os.environ.get("EOS_KAFKA_BOOTSTRAP", "localhost:9092")
POSTGRES = os.environ.get("EOS_POSTGRES_DSN", "postgresql://eos:eos@localhost:5432/eos")
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "the", "end"]


def write_words(topic: str) -> None:
    """The input: ``topic`` (created when missing) gets one record a word."""
    admin = AdminClient({"bootstrap.servers": KAFKA})
    try:
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    producer = Producer({"bootstrap.servers": KAFKA})
    for word in WORDS:
        producer.produce(topic, key=word.encode(), value=word.encode())
    producer.flush(30)


def count_words(
    spark: SparkSession, topic: str, table: str, checkpoint: str
) -> list[tuple[str, int]]:
    """The query (as in the README, with ``availableNow`` so that it ends), then the table."""
    register(spark)  # adds the formats eos_kafka, eos_postgres, eos_redis
    counts = (
        spark.readStream.format("eos_kafka")  # was: .format("kafka")
        .option("kafka.bootstrap.servers", KAFKA)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr("CAST(key AS STRING) AS word")
        .groupBy("word")
        .count()
    )
    query = (
        counts.writeStream.format("eos_postgres")
        .outputMode("complete")
        .option("dsn", POSTGRES)
        .option("table", table)
        .option("mode", "upsert")
        .option("keyColumns", "word")
        .option("createTable", "true")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    with psycopg.connect(POSTGRES) as conn:
        statement = sql.SQL("SELECT word, count FROM {} ORDER BY word").format(
            sql.Identifier(table)
        )
        rows = conn.execute(statement).fetchall()
    return [(str(word), int(count)) for word, count in rows]


def main(
    spark: SparkSession | None = None,
    topic: str = "words",
    table: str = "word_counts",
    checkpoint: str = str(Path(tempfile.gettempdir()) / "eos-quickstart" / "checkpoint"),
) -> list[tuple[str, int]]:
    write_words(topic)
    session = spark or SparkSession.builder.master("local[2]").appName("quickstart").getOrCreate()
    Path(checkpoint).parent.mkdir(parents=True, exist_ok=True)
    rows = count_words(session, topic, table, checkpoint)
    for word, count in rows:
        print(f"{word:<8} {count}")
    return rows


if __name__ == "__main__":
    main()
    sys.exit(0)
