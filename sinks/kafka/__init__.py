"""The Kafka sink (``eos_kafka`` as a sink): one transaction per task, fenced and marked.

* :class:`KafkaExactlyOnceWriter` (``exactly_once``): the default guarantee;
* :class:`KafkaAtLeastOnceWriter` (``at_least_once``): ``deliveryGuarantee=at-least-once``;
* ``claim``, ``marker``, ``marker_log``: the sink's bookkeeping; ``clients``, ``pool``:
  its librdkafka clients, kept per Python worker; ``admin``: ``eos sinks`` over Kafka.
"""

from eos_connectors.sinks.kafka.at_least_once import KafkaAtLeastOnceWriter
from eos_connectors.sinks.kafka.exactly_once import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.options import KafkaSinkOptions, parse_options

__all__ = ["KafkaAtLeastOnceWriter", "KafkaExactlyOnceWriter", "KafkaSinkOptions", "parse_options"]
