from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

from eos_connectors.sinks.kafka.errors import Action, classify, error_of


@pytest.mark.parametrize(
    ("error", "action"),
    [
        (KafkaError(KafkaError._TIMED_OUT, retriable=True), Action.RETRY),
        (KafkaError(KafkaError.COORDINATOR_NOT_AVAILABLE, retriable=True), Action.RETRY),
        # a metadata or offsets request whose connection was reset: unflagged, asked again
        (KafkaError(KafkaError._TRANSPORT), Action.RETRY),
        (KafkaError(KafkaError._ALL_BROKERS_DOWN), Action.RETRY),
        (KafkaError(KafkaError._STATE, txn_requires_abort=True), Action.ABORT),
        # abortable wins over retriable: retrying inside a doomed transaction is useless
        (KafkaError(KafkaError._TIMED_OUT, retriable=True, txn_requires_abort=True), Action.ABORT),
        (KafkaError(KafkaError.PRODUCER_FENCED, fatal=True), Action.FAIL),
        (KafkaError(KafkaError._FENCED), Action.FAIL),
        (KafkaError(KafkaError.INVALID_PRODUCER_EPOCH, fatal=True, retriable=True), Action.FAIL),
        (KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED), Action.FAIL),
    ],
)
def test_classify_by_flags(error: KafkaError, action: Action) -> None:
    assert classify(error) is action


def test_error_of_unwraps_the_exception() -> None:
    error = KafkaError(KafkaError._TIMED_OUT, retriable=True)
    assert error_of(KafkaException(error)) is error
    assert error_of(KafkaException("text only")).code() == KafkaError._FAIL


def test_security_settings_reach_every_client_and_never_a_repr() -> None:
    """The marker reader and the start checks need SASL/TLS like the producer."""
    from eos_connectors.sinks.kafka.options import parse_options

    options = parse_options(
        {
            "kafka.bootstrap.servers": "b:9093",
            "topic": "t",
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.username": "u",
            "kafka.sasl.password": "hunter2",
            "kafka.linger.ms": "7",
        }
    )
    assert options.client_config() == {
        "bootstrap.servers": "b:9093",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "hunter2",
    }
    assert options.producer_config()["sasl.password"] == "hunter2"
    assert "hunter2" not in repr(options)


def test_keys_are_partitioned_as_java_producers_do_unless_told_otherwise() -> None:
    """murmur2 by default (librdkafka's own default hashes keys with CRC32); Spark jobs'
    ``kafka.partitioner.class`` is translated where librdkafka has the same, refused
    (naming the option and what to do) where it has not; ``kafka.partitioner`` wins."""
    import pytest

    from eos_connectors.core.errors import ConfigError
    from eos_connectors.sinks.kafka.options import parse_options

    base = {"kafka.bootstrap.servers": "unused:9092", "topic": "t"}
    assert parse_options(base).producer_config()["partitioner"] == "murmur2_random"
    java = "org.apache.kafka.clients.producer.internals.DefaultPartitioner"
    given = parse_options({**base, "kafka.partitioner.class": java})
    assert given.producer_config()["partitioner"] == "murmur2_random"
    own = parse_options({**base, "kafka.partitioner": "fnv1a_random"})
    assert own.producer_config()["partitioner"] == "fnv1a_random"
    for refused in (
        "com.example.MyPartitioner",
        "org.apache.kafka.clients.producer.RoundRobinPartitioner",
    ):
        with pytest.raises(ConfigError, match=r"'kafka\.partitioner\.class'.*'partition' column"):
            parse_options({**base, "kafka.partitioner.class": refused})
    assert parse_options({**base, "includeHeaders": "true"}).topic == "t"  # Spark ignores it


def test_a_timestamp_column_sets_each_records_timestamp_in_milliseconds() -> None:
    import datetime as dt

    import pyarrow as pa

    from eos_connectors.sinks.kafka.records import rows

    when = dt.datetime(2026, 11, 25, 12, 0, 0, 123456, tzinfo=dt.UTC)
    batch = pa.RecordBatch.from_pydict(
        {
            "value": [b"a", b"b"],
            "timestamp": pa.array([when, None], pa.timestamp("us", tz="UTC")),
            "offset": [7, 8],  # a source's column the sink leaves alone
        }
    )
    (written,) = rows(iter([batch]), "out")
    millis = int(when.timestamp() * 1000)
    assert written == [
        ("out", b"a", None, None, None, millis),
        ("out", b"b", None, None, None, None),
    ]


def test_a_timestamp_column_of_another_type_is_refused_at_start() -> None:
    from pyspark.sql.types import BinaryType, LongType, StructField, StructType

    from eos_connectors.core.errors import ConfigError
    from eos_connectors.sinks.kafka.columns import check_schema

    schema = StructType([StructField("value", BinaryType()), StructField("timestamp", LongType())])
    with pytest.raises(ConfigError, match="Column 'timestamp' must be timestamp"):
        check_schema(schema, has_topic_option=True)


def test_a_librdkafka_call_that_never_returns_fails_the_task_in_bounded_time() -> None:
    """send_offsets_to_transaction() can block for good when the group coordinator died
    (confluentinc/librdkafka#5456): the task gives the call up after its limit."""
    import threading
    import time

    from eos_connectors.sinks.kafka.clients import StuckCallError, bounded

    never = threading.Event()
    began = time.monotonic()
    with pytest.raises(StuckCallError, match="send_offsets_to_transaction did not return"):
        bounded(never.wait, "send_offsets_to_transaction", 0.2)
    assert time.monotonic() - began < 2
    never.set()  # the helper thread ends
    assert bounded(lambda: 7, "x", 5) == 7
    error = KafkaError(KafkaError._TIMED_OUT, retriable=True)
    with pytest.raises(KafkaException) as raised:  # the call's own error, as it was
        bounded(lambda: (_ for _ in ()).throw(KafkaException(error)), "x", 5)
    assert error_of(raised.value) is error


def test_a_request_whose_connection_was_reset_is_asked_again() -> None:
    """A task's topic look-up met a reset connection (a 4 s Kafka reset through a real
    proxy, in a query): librdkafka's error is unflagged, and the task failed with it
    ("fenced or in a fatal state"); it is asked again, as a moving coordinator is. ~0.6 s
    of back-off."""
    from eos_connectors.sinks.kafka.clients import call

    lost = KafkaError(KafkaError._TRANSPORT, "Failed to get metadata: Broker transport failure")
    tries: list[int] = []

    def look_up() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise KafkaException(lost)
        return "answered"

    assert call(look_up, "metadata") == "answered"
    assert len(tries) == 3


class _Report:
    """A delivery report's message as confluent-kafka hands it to ``on_delivery``."""

    def __init__(self, key: bytes, value: bytes, pending: KafkaException | None = None) -> None:
        self._key, self._value, self._pending = key, value, pending

    def topic(self) -> str:
        return "out"

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes:
        if self._pending is not None:  # what CPython does with an exception left set
            raise SystemError("value returned a result with an exception set") from self._pending
        return self._value


class _Flushing:
    """A producer whose flush() serves the given delivery reports, then has ``left``."""

    def __init__(self, on_delivery: object, reports: list[tuple[KafkaError, _Report]]) -> None:
        self.on_delivery, self.reports, self.flushes = on_delivery, reports, 0

    fatal: KafkaError | None = None  # the producer's fatal state
    lost: bool = False  # flush() raises with the fatal error lost on the way

    def flush(self, timeout: float) -> int:
        self.flushes += 1
        if self.lost:
            raise SystemError("<method 'flush'> returned NULL without setting an exception")
        for error, message in self.reports:
            self.on_delivery(error, message)  # type: ignore[operator]
        self.reports = []
        return 3

    def abort_transaction(self, timeout: float) -> None:
        if self.fatal is not None:
            raise KafkaException(self.fatal)


def test_a_refused_batch_names_its_largest_record_and_the_wait_ends_at_it() -> None:
    """A broker refuses a whole batch for its size and reports each record: the error
    names the largest (never its value) and the setting; the wait ends at once."""
    from eos_connectors.sinks.kafka.clients import DeliveryFailures, wait_delivered
    from eos_connectors.sinks.kafka.errors import KafkaSinkError

    failures = DeliveryFailures()
    too_large = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
    reports = [
        (too_large, _Report(f"k{i}".encode(), b"v" * (9000 if i == 2 else 9))) for i in range(5)
    ]
    producer = _Flushing(failures, reports)
    with pytest.raises(KafkaSinkError) as refused:
        wait_delivered(producer, failures, "Task partition 0 of batch 3")  # type: ignore[arg-type]
    said = str(refused.value)
    assert "Kafka refused 5 records" in said and "key 'k2' (9,000 bytes of value)" in said
    assert "kafka.batch.size" in said and "vvv" not in said
    assert producer.flushes == 1


def test_a_fenced_producers_refusals_fail_the_task_as_fenced() -> None:
    """A producer fenced (a transaction the broker timed out) gets its records back with
    the fatal error, or confluent-kafka leaves that error set for the poll while it
    serves the reports, or loses it on the way: each way the task's error is one its
    callers tell as fenced (services runs met the last two, one run in three)."""
    from eos_connectors.sinks.kafka.clients import DeliveryFailures, is_fenced, wait_delivered
    from eos_connectors.sinks.kafka.errors import KafkaSinkError

    fenced = KafkaError(KafkaError._FENCED, fatal=True)
    for report in (_Report(b"k", b"v"), _Report(b"k", b"v", pending=KafkaException(fenced))):
        failures = DeliveryFailures()
        producer = _Flushing(failures, [(fenced, report)])
        with pytest.raises(KafkaSinkError) as failed:
            wait_delivered(producer, failures, "Task partition 0 of batch 3")  # type: ignore[arg-type]
        assert is_fenced(failed.value)
    # the error lost on the way: the producer's own fatal state says it
    failures = DeliveryFailures()
    producer = _Flushing(failures, [])
    producer.lost, producer.fatal = True, fenced
    with pytest.raises(KafkaSinkError) as failed:
        wait_delivered(producer, failures, "Task partition 0 of batch 3")  # type: ignore[arg-type]
    assert is_fenced(failed.value)
    producer.fatal = None  # not fatal: the SystemError is not explained away
    with pytest.raises(SystemError):
        wait_delivered(producer, failures, "Task partition 0 of batch 3")  # type: ignore[arg-type]


def test_a_record_to_a_topic_that_does_not_exist_says_the_sink_creates_none() -> None:
    from eos_connectors.sinks.kafka.clients import DeliveryFailures

    failures = DeliveryFailures()
    failures(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART), _Report(b"k57", b"v"))
    assert failures.first is not None
    assert "key 'k57'" in failures.first and "never creates one" in failures.first
