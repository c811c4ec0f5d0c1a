"""The source and the Kafka sink over the broker's SASL listener (SCRAM-SHA-512).

Everything goes through Spark's ``kafka.*`` pass-through options: the source's
look-ups and reads, the sink's transactions, its markers (group offsets and the
marker log) and the fencing of a zombie producer.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from eos_connectors.core import faults
from eos_connectors.core.context import TaskIdentity
from eos_connectors.core.errors import ServiceUnavailableError
from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints, KafkaSasl
from eos_connectors.sinks.kafka.checks import check_broker
from eos_connectors.sinks.kafka.clients import fenced_producer
from eos_connectors.sinks.kafka.exactly_once import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.options import parse_options as sink_options
from eos_connectors.sources.kafka.broker import BrokerView
from eos_connectors.sources.kafka.options import parse_options as source_options

pytestmark = pytest.mark.services


def _rows(values: list[bytes]) -> list[pa.RecordBatch]:
    keys = [b"k" for _ in values]
    return [pa.RecordBatch.from_arrays([pa.array(keys), pa.array(values)], ["key", "value"])]


def _values(endpoints: Endpoints, topic: str, isolation: str = "read_committed") -> list[bytes]:
    return sorted(r.value for r in read_to_end(endpoints.kafka, topic, isolation))


def test_sink_markers_and_fencing_work_over_sasl(
    endpoints: Endpoints, sasl: KafkaSasl, unique: str
) -> None:
    """A task committed then replayed is skipped (its marker read over SASL); a zombie
    producer of the same transactional id is fenced and its records stay invisible."""
    topic = f"sasl-sink-{unique}"
    create_topic(sasl.client_config(), topic)
    options = sink_options({**sasl.options(), "topic": topic, "sinkId": f"sasl-{unique}"})
    check_broker(options)
    writer = KafkaExactlyOnceWriter(options)
    task = TaskIdentity("sasl-query", "kafka", "run-1", 0, 0, 1)
    with pytest.raises(faults.SimulatedCrash), faults.simulate("after-commit@0"):
        writer.write_task(task, iter(_rows([b"one", b"two"])))
    replay = TaskIdentity("sasl-query", "kafka", "run-2", 0, 0, 2)
    assert writer.write_task(replay, iter(_rows([b"one", b"two"]))).skipped
    name = f"sasl-zombie-{unique}"
    zombie = fenced_producer(options, name)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie", b"k")
    zombie.flush(30)
    retry = fenced_producer(options, name)  # init_transactions fences the zombie
    with pytest.raises(Exception, match=r"(?i)fenced|epoch"):
        zombie.commit_transaction(30)
    retry.begin_transaction()
    retry.produce(topic, b"retry", b"k")
    retry.commit_transaction(30)
    assert _values(endpoints, topic) == [b"one", b"retry", b"two"]
    assert b"zombie" in _values(endpoints, topic, "read_uncommitted")
    assert any(r.value for r in read_to_end(endpoints.kafka, options.marker_log))


def test_a_wrong_sasl_password_is_a_clear_error(sasl: KafkaSasl) -> None:
    wrong = f"wrong-{uuid.uuid4().hex}"
    options = {**sasl.options(), "kafka.sasl.password": wrong, "subscribe": "t"}
    view = BrokerView(source_options({**options, "kafkaConsumer.pollTimeoutMs": "5000"}))
    with pytest.raises(ServiceUnavailableError, match=r"(?i)authentication") as failure:
        view.partitions()
    assert wrong not in str(failure.value)


def test_eos_sinks_reaches_a_sasl_cluster_with_the_settings_of_eos_kafka_config(
    endpoints: Endpoints,
    sasl: KafkaSasl,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``eos sinks`` takes the client settings a SASL (or TLS) cluster needs from the file
    EOS_KAFKA_CONFIG names, so the password is never on a command line or in its output."""
    from eos_connectors.cli import main

    topic, sink_id = f"sasl-admin-{unique}", f"sasl-admin-{unique}"
    create_topic(sasl.client_config(), topic)
    options = sink_options({**sasl.options(), "topic": topic, "sinkId": sink_id})
    check_broker(options)
    task = TaskIdentity("sasl-query", "kafka", "run-1", 3, 0, 1)
    KafkaExactlyOnceWriter(options).write_task(task, iter(_rows([b"a", b"b"])))
    config = tmp_path / "client.properties"
    settings = {k: v for k, v in sasl.client_config().items() if k != "bootstrap.servers"}
    config.write_text(
        "# the sink's kafka.* settings\n" + "".join(f"kafka.{k}={v}\n" for k, v in settings.items())
    )
    monkeypatch.setenv("EOS_KAFKA_BOOTSTRAP", sasl.bootstrap)
    monkeypatch.setenv("EOS_KAFKA_CONFIG", str(config))
    for name in ("EOS_POSTGRES_DSN", "EOS_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    assert main(["sinks", "list"]) == 0
    listed = capsys.readouterr()
    line = next(row for row in listed.out.splitlines() if sink_id in row)
    assert line.split()[:4] == ["kafka", sink_id, "sasl-query", "3"], line
    assert sasl.password not in listed.out + listed.err
