"""``spark.read.format("eos_kafka")``: a bounded read of the topics, as Spark's ``kafka``
batch source reads them.

The driver resolves ``startingOffsets`` (default earliest) and ``endingOffsets``
(default latest) once, per partition, and plans the ranges as a stream's batch
is planned (``minPartitions``, ``maxPartitions``, ``maxRecordsPerPartition``);
the tasks read them with the stream's reader. Under the default read_committed
"latest" is each partition's last stable offset, so a batch read returns exactly
the committed records below it, and nothing of a transaction still open.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSourceReader, InputPartition

from eos_connectors.core.errors import ConfigError
from eos_connectors.sources.kafka.broker import BrokerView
from eos_connectors.sources.kafka.offsets import pack_ranges, plan_ranges
from eos_connectors.sources.kafka.options import KafkaSourceOptions, check_for_batch

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

#: Stream-only options a batch read ignores, with a warning, as Spark's does.
_STREAM_ONLY = (
    ("max_offsets_per_trigger", "maxOffsetsPerTrigger"),
    ("min_offsets_per_trigger", "minOffsetsPerTrigger"),
)


class KafkaBatchReader(DataSourceReader):
    def __init__(self, options: KafkaSourceOptions) -> None:
        check_for_batch(options)
        for field, name in _STREAM_ONLY:
            if getattr(options, field) is not None:
                log.warning("eos_kafka: option %s is ignored in batch reads", name)
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        """Driver: the read's ranges, from the starting to the ending offsets."""
        broker = BrokerView(self.options)
        tps = broker.partitions()
        begin = broker.initial(tps, default="earliest")
        end = broker.ending(tps)
        crossed = sorted(tp for tp in tps if begin[tp] > end[tp])
        if crossed:
            where = ", ".join(f"{t}-{p} from {begin[(t, p)]} to {end[(t, p)]}" for t, p in crossed)
            raise ConfigError(
                f"The read's start is after its end in {where}: check startingOffsets/"
                "startingTimestamp against endingOffsets/endingTimestamp."
            )
        options = self.options
        ranges = plan_ranges(begin, end, options.min_partitions, options.max_records_per_partition)
        return pack_ranges(ranges, options.max_partitions)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Task: the partition's records (:func:`read_partition`)."""
        from eos_connectors.sources.kafka.fetch import read_partition  # pyarrow: tasks only

        return read_partition(self.options, partition)
