"""A failed query's event names what it died of, not only Spark's first line. Cost: ~0 s."""

from __future__ import annotations

from eos_connectors.dev.harness.pipeline import failure_cause

#: What a CI run's Kafka query died of, as Spark reported it (shortened).
SPARK_ERROR = """[PYTHON_STREAMING_DATA_SOURCE_RUNTIME_ERROR] Failed when Python streaming \
data source perform commit: Traceback (most recent call last):
  File "/x/eos_connectors/sinks/kafka/coordinator.py", line 323, in check_batch_commit
    client.close()
eos_connectors.sinks.kafka.coordinator.TransactionEndError: The driver cannot describe \
transactional id 'eos-a-0' (NotCoordinatorError): grant them or use commitMode=task.
 SQLSTATE: 38000
\tat org.apache.spark.sql.errors.QueryExecutionErrors$.pythonStreamingDataSourceRuntimeError"""


def test_the_cause_is_the_tracebacks_exception_line() -> None:
    assert failure_cause(SPARK_ERROR).startswith(
        "eos_connectors.sinks.kafka.coordinator.TransactionEndError: The driver cannot"
    )
    assert failure_cause("ValueError: bad\nKeyError: 'x'") == "KeyError: 'x'"
    assert failure_cause("[STREAM_FAILED] no traceback") == ""
