"""``availableNow`` for the harness on PySpark 4.0-4.1, which run it as a single batch.

Before 4.2 Spark gives a Python source no read limit and runs ``availableNow`` as one
batch up to the end it saw first, so a pipeline bounded by ``maxOffsetsPerTrigger``
would stop after its first batch. There the harness runs each query with a
``processingTime`` trigger, lets the source bound its batches (``legacyReadLimits``),
and stops the query once its checkpoint has committed a batch that reached the end of
its input (written whole before the pipeline starts). A continuous query (the
benchmark's) runs a ``processingTime`` trigger anyway, and needs the same option.
"""

from __future__ import annotations

from eos_connectors.core.spark_api import HAS_READ_LIMITS
from eos_connectors.dev.harness.spec import PipelineSpec, QuerySpec
from eos_connectors.ops.checkpoint import batches, read_offsets
from eos_connectors.ops.locations import location
from eos_connectors.sources.kafka.offsets import Offsets, from_spark


def drains(spec: PipelineSpec) -> bool:
    """Whether this run's ``availableNow`` queries are drained (PySpark 4.0-4.1)."""
    return spec.trigger == "available-now" and not HAS_READ_LIMITS


def source_options(query: QuerySpec) -> dict[str, str]:
    """What this package's source needs to bound its batches itself on PySpark 4.0-4.1.
    There every query of the harness runs a ``processingTime`` trigger: a drained
    ``availableNow`` one, and a continuous one (the benchmark's), whose
    ``maxOffsetsPerTrigger`` the source refuses without ``legacyReadLimits``. Spark's
    own ``kafka`` format needs nothing."""
    if HAS_READ_LIMITS or query.source == "kafka":
        return {}
    return {"legacyReadLimits": "true"}


class Drain:
    """The input's end per query (asked once), and whether a query's checkpoint reached it."""

    def __init__(self, spec: PipelineSpec) -> None:
        self.spec = spec
        self._ends: dict[str, Offsets] = {}

    def done(self, query: QuerySpec) -> bool:
        """True once ``query``'s last committed batch ends at or past every partition's end."""
        reached = committed_ends(self.spec, query)
        if reached is None:
            return False
        if query.name not in self._ends:
            from confluent_kafka import KafkaException

            try:
                self._ends[query.name] = input_ends(self.spec, query)
            except KafkaException as exc:  # a broker the harness killed: ask at the next check
                print(f"drain: {query.name}'s input ends not known yet: {exc}", flush=True)
                return False
        return all(reached.get(tp, -1) >= end for tp, end in self._ends[query.name].items())


def committed_ends(spec: PipelineSpec, query: QuerySpec) -> Offsets | None:
    """Where ``query``'s last committed batch ends (its ``offsets/N``'s source offset)."""
    folder = location(spec.checkpoint) / query.name
    committed = batches(folder / "commits")
    if not committed:
        return None
    _, sources = read_offsets(folder, committed[-1])
    return from_spark(sources[-1])


def input_ends(spec: PipelineSpec, query: QuerySpec) -> Offsets:
    """The high watermark of each partition of ``query``'s topic: the input is written (and
    every transaction of it ended) before the pipeline starts."""
    from confluent_kafka import Consumer, TopicPartition

    settings = {
        k[len("kafka.") :]: v for k, v in query.source_options.items() if k.startswith("kafka.")
    }
    consumer = Consumer({**settings, "bootstrap.servers": spec.bootstrap, "group.id": "eos-drain"})
    try:
        topic = consumer.list_topics(query.topic, timeout=30).topics[query.topic]
        return {
            (query.topic, p): consumer.get_watermark_offsets(
                TopicPartition(query.topic, p), timeout=30, cached=False
            )[1]
            for p in topic.partitions
        }
    finally:
        consumer.close()
