"""A keyed word-count pipeline run as its own OS process: ``eos_kafka`` -> state -> sink.

``python -m connectors.harness.pipeline --topic T --checkpoint DIR --sink postgres ...``

The stateful stage is Spark's ``groupBy().count()`` (``--state count``, complete
mode) or a ``transformWithStateInPandas`` processor (``--state processor``,
append mode: it emits each changed word's new count) keeping a running count
per word; both end in (word, count) rows the sink upserts. The processor also
emits ``delta``, the word's count in this batch, which the Redis sink adds to a
counter with ``--redis-mode increment``. Fault points
are armed through ``EOS_FAULT_*`` (see connectors/faults.py); the process puts
its own process group in ``EOS_FAULT_PGID`` so a fault can crash the whole query.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.readwriter import DataStreamWriter


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m connectors.harness.pipeline")
    parser.add_argument("--bootstrap", default=os.environ.get("EOS_KAFKA_BOOTSTRAP"))
    parser.add_argument("--topic", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--state", choices=["count", "processor", "none"], default="count")
    parser.add_argument(
        "--sink", action="append", default=[], choices=["postgres", "kafka", "redis"],
        help="a built-in sink; repeat for several (one query and checkpoint each)",
    )  # fmt: skip
    parser.add_argument("--custom-format", default=None, help="another sink, by format name")
    parser.add_argument(
        "--custom-option", action="append", default=[], metavar="KEY=VALUE",
        help="an option of the --custom-format sink; repeat for several",
    )  # fmt: skip
    parser.add_argument(
        "--register", action="append", default=[], metavar="MODULE:CLASS",
        help="a DataSource to register before starting (a connector author's sink)",
    )  # fmt: skip
    parser.add_argument("--out-topic", default=None, help="the Kafka sink's topic")
    parser.add_argument("--dsn", default=os.environ.get("EOS_POSTGRES_DSN"))
    parser.add_argument("--table", default="word_counts")
    parser.add_argument("--redis-url", default=os.environ.get("EOS_REDIS_URL"))
    parser.add_argument("--redis-mode", choices=["upsert", "increment"], default="upsert")
    parser.add_argument("--key-prefix", default="count:", help="the Redis sink's key prefix")
    parser.add_argument("--max-offsets", default="500")
    parser.add_argument(
        "--trigger", choices=["available-now", "continuous"], default="available-now"
    )
    parser.add_argument(
        "--every", default="500 milliseconds", help="--trigger continuous's interval"
    )
    parser.add_argument("--delivery", default="exactly-once")
    parser.add_argument(
        "--connector", choices=["eos", "spark"], default="eos",
        help="eos: this package's eos_kafka source and sink; spark: Spark's JVM kafka ones",
    )  # fmt: skip
    parser.add_argument(
        "--events", action="store_true", help="print a JSON line per batch (eos bench reads them)"
    )
    parser.add_argument(
        "--sink-id", default=None,
        help="sinkId of each built-in sink is <this>-<sink> (default: derived from the query)",
    )  # fmt: skip
    return parser.parse_args(argv)


def pipeline(spark: SparkSession, args: argparse.Namespace) -> DataFrame:
    """(word, count) from a stateful stage, or with ``--state none`` every record's
    (word, partition, offset) for append mode."""
    records = (
        spark.readStream.format("eos_kafka" if args.connector == "eos" else "kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_offsets)
        .load()
    )
    if args.state == "none":
        return records.selectExpr("CAST(key AS STRING) AS word", "partition", "offset")
    words = records.selectExpr("CAST(key AS STRING) AS word")
    if args.state == "count":
        return words.groupBy("word").count()
    return words.groupBy("word").transformWithStateInPandas(
        statefulProcessor=_running_count_processor(),
        outputStructType="word string, count long, delta long",
        outputMode="Append",
        timeMode="None",
    )


def _running_count_processor() -> Any:
    """A StatefulProcessor keeping each word's count in a ValueState."""
    import pandas as pd
    from pyspark.sql.streaming.stateful_processor import (
        StatefulProcessor,
        StatefulProcessorHandle,
    )

    class RunningCount(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: StatefulProcessorHandle) -> None:
            self.total = handle.getValueState("total", "total long")

        def handleInputRows(
            self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any
        ) -> Iterator[pd.DataFrame]:
            stored = self.total.get() if self.total.exists() else None
            delta = sum(len(frame) for frame in rows)
            total = (int(stored[0]) if stored else 0) + delta
            self.total.update((total,))
            yield pd.DataFrame({"word": [key[0]], "count": [total], "delta": [delta]})

        def close(self) -> None:
            pass

    return RunningCount()


def with_trigger(writer: DataStreamWriter, trigger: str, every: str) -> DataStreamWriter:
    """``available-now``: process what is there, then stop; ``continuous``: every ``every``."""
    if trigger == "available-now":
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=every)


def output_mode(state: str) -> str:
    """PySpark's Python sinks take append and complete mode, not update: an aggregate
    rewrites its whole (small) result each batch; the processor emits changed keys."""
    return "complete" if state == "count" else "append"


def postgres_writer(result: DataFrame, args: argparse.Namespace) -> DataStreamWriter:
    if args.state != "none":
        result = result.select("word", "count")
    writer = (
        result.writeStream.format("eos_postgres")
        .option("dsn", args.dsn)
        .option("table", args.table)
        .option("mode", "append" if args.state == "none" else "upsert")
        .option("createTable", "true")
        .option("deliveryGuarantee", args.delivery)
    )
    return writer if args.state == "none" else writer.option("keyColumns", "word")


def kafka_writer(result: DataFrame, args: argparse.Namespace) -> DataStreamWriter:
    """key = word; value = the count, or "partition:offset" of the input record."""
    value = "CAST(count AS STRING)" if args.state != "none" else "concat(partition, ':', offset)"
    rows = result.selectExpr("CAST(word AS BINARY) AS key", f"CAST({value} AS BINARY) AS value")
    if args.connector == "spark":  # Spark's own sink: at-least-once, no sinkId
        writer = rows.writeStream.format("kafka")
    else:
        writer = rows.writeStream.format("eos_kafka").option("deliveryGuarantee", args.delivery)
    return writer.option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.out_topic)


def redis_writer(result: DataFrame, args: argparse.Namespace) -> DataStreamWriter:
    """key = prefix + word; upsert the running count, or add each batch's delta."""
    if args.redis_mode == "increment" and args.state != "processor":
        raise SystemExit("--redis-mode increment needs --state processor (per-batch deltas)")
    value = "delta" if args.redis_mode == "increment" else "count"
    return (
        result.select("word", value)
        .writeStream.format("eos_redis")
        .option("url", args.redis_url)
        .option("keyColumn", "word")
        .option("valueColumns", value)
        .option("keyPrefix", args.key_prefix)
        .option("mode", args.redis_mode)
        .option("deliveryGuarantee", args.delivery)
    )


def custom_writer(result: DataFrame, args: argparse.Namespace) -> DataStreamWriter:
    """(word, count) rows to the sink named by ``--custom-format`` and ``--custom-option``."""
    if args.state != "none":
        result = result.select("word", "count")
    writer = result.writeStream.format(args.custom_format)
    for option in args.custom_option:
        key, sep, value = option.partition("=")
        if not sep:
            raise SystemExit(f"--custom-option {option!r}: expected KEY=VALUE")
        writer = writer.option(key, value)
    return writer


def with_sink_id(writer: DataStreamWriter, args: argparse.Namespace, sink: str) -> DataStreamWriter:
    return writer.option("sinkId", f"{args.sink_id}-{sink}") if args.sink_id else writer


WRITERS = {
    "postgres": postgres_writer,
    "kafka": kafka_writer,
    "redis": redis_writer,
    "custom": custom_writer,
}


def register_sources(spark: SparkSession, references: list[str]) -> None:
    from pyspark.sql.datasource import DataSource

    from connectors.harness import load

    for reference in references:
        source = load(reference)
        if not (isinstance(source, type) and issubclass(source, DataSource)):
            raise SystemExit(f"--register {reference}: not a pyspark DataSource class")
        spark.dataSource.register(source)


def _wait_first_batch(query: Any, timeout: float = 60.0) -> None:
    """Start queries one after the other: tasks of queries that started together
    sometimes failed to deserialize (java.io.OptionalDataException, Spark 4.3)."""
    import time

    deadline = time.monotonic() + timeout
    while query.isActive and not query.recentProgress and time.monotonic() < deadline:
        time.sleep(0.2)


def _connector_conf(connector: str) -> dict[str, str]:
    if connector == "eos":
        return {}
    from connectors.compare.jars import spark_kafka_jars

    return {"spark.jars": ",".join(str(jar) for jar in spark_kafka_jars())}


EVENT_PREFIX = "EOS-EVENT "


def print_event(event: str, **fields: Any) -> None:
    """One JSON line on stdout, stamped with the wall clock (``eos bench`` reads them)."""
    import json
    import time

    print(EVENT_PREFIX + json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def _batch_events() -> Any:
    """A listener printing each batch's rows and Spark's own timings once it is committed."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class BatchEvents(StreamingQueryListener):  # type: ignore[misc]
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress = event.progress
            print_event(
                "batch", batch=progress.batchId, records=progress.numInputRows,
                durations=dict(progress.durationMs),
            )  # fmt: skip

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    return BatchEvents()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sinks = args.sink + (["custom"] if args.custom_format else [])
    if not sinks:
        raise SystemExit("name at least one --sink or a --custom-format")
    os.environ["EOS_FAULT_PGID"] = str(os.getpgid(0))
    from connectors.spark import local_session

    spark = local_session(f"eos-pipeline-{'-'.join(sinks)}", conf=_connector_conf(args.connector))
    register_sources(spark, args.register)
    if args.events:
        spark.streams.addListener(_batch_events())
    queries = []
    for sink in sinks:
        # A DataFrame of its own per query: queries starting together must not share
        # plan objects (a shared plan made a task fail to deserialize in Spark 4.3).
        result = pipeline(spark, args)
        checkpoint = args.checkpoint if len(sinks) == 1 else f"{args.checkpoint}/{sink}"
        writer = WRITERS[sink](result, args).outputMode(output_mode(args.state))
        if sink != "custom" and args.connector == "eos":
            writer = with_sink_id(writer, args, sink)
        writer = writer.option("checkpointLocation", checkpoint).queryName(f"to_{sink}")
        queries.append(with_trigger(writer, args.trigger, args.every).start())
        if args.events:
            print_event("ready", query=queries[-1].name)
        _wait_first_batch(queries[-1])
    if args.trigger == "continuous":
        spark.streams.awaitAnyTermination()
    for query in queries:
        query.awaitTermination()


if __name__ == "__main__":
    main()
