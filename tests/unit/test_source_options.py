from __future__ import annotations

import pytest

from eos_connectors.core.errors import ConfigError
from eos_connectors.sources.kafka import read
from eos_connectors.sources.kafka.offsets import KafkaRange
from eos_connectors.sources.kafka.options import parse_options

BASE = {"kafka.bootstrap.servers": "h:9092", "subscribe": "a,b"}


def test_defaults_match_sparks_kafka_source() -> None:
    options = parse_options(BASE)
    assert options.topics == ("a", "b")
    assert options.starting_offsets == "latest"
    assert options.fail_on_data_loss is True
    assert options.include_headers is False
    assert options.max_offsets_per_trigger is None
    assert options.isolation_level == "read_committed"


def test_keys_are_case_insensitive_and_kafka_settings_pass_through() -> None:
    options = parse_options(
        {
            "kafka.bootstrap.servers": "h:9092",
            "SUBSCRIBEPATTERN": "orders-.*",
            "startingOffsets": "EARLIEST",
            "kafka.fetch.max.bytes": "1048576",
            "kafka.isolation.level": "read_uncommitted",
        }
    )
    assert options.subscription == "subscribePattern"
    assert options.matches("orders-eu") and not options.matches("xorders-eu")
    assert options.starting_offsets == "earliest"
    assert options.client_config()["fetch.max.bytes"] == "1048576"
    assert options.read_committed is False


def test_assign_and_json_offsets() -> None:
    options = parse_options(
        {
            "kafka.bootstrap.servers": "h:9092",
            "assign": '{"t": [1, 0]}',
            "startingOffsets": '{"t": {"0": -2, "1": 17}}',
        }
    )
    assert options.assigned == (("t", 0), ("t", 1))
    assert options.starting_offsets == {"t": {0: -2, 1: 17}}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"subscribe": ""}, "Exactly one of"),
        ({"assign": '{"t": [0]}'}, r"found: subscribe, assign"),
        ({"startingOffsets": "{nope"}, "'startingOffsets' is not valid JSON"),
        ({"startingOffsets": '{"a": {"0": -3}}'}, "must be an integer >= -2"),
        ({"maxOffsetsPerTrigger": "0"}, "'maxOffsetsPerTrigger' must be >= 1"),
        ({"maxOffsetsPerTrigger": "lots"}, "'maxOffsetsPerTrigger' must be an integer"),
        ({"failOnDataLoss": "maybe"}, "'failOnDataLoss' must be true or false"),
        ({"endingOffsets": "latest"}, "'endingoffsets' is not supported"),
        ({"minOffsetsPerTrigger": "5"}, "'minoffsetspertrigger' is not supported"),
        ({"subscribePatern": "x"}, "Unknown option 'subscribepatern'"),
        ({"kafka.group.id": "g"}, "'kafka.group.id' cannot be set"),
        ({"kafka.auto.offset.reset": "earliest"}, "use startingOffsets"),
        ({"kafka.isolation.level": "dirty"}, "'kafka.isolation.level' must be"),
        ({"startingTimestamp": "1", "startingOffsetsByTimestamp": "{}"}, "only one of"),
        ({"maxPartitions": "0"}, "'maxPartitions' must be >= 1"),
        ({"minPartitions": "8", "maxPartitions": "2"}, r"'minPartitions' \(8\) is above"),
    ],
)
def test_bad_options_name_the_option(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_options({**BASE, **extra})


def test_missing_bootstrap_servers() -> None:
    with pytest.raises(ConfigError, match=r"'kafka\.bootstrap\.servers' is required"):
        parse_options({"subscribe": "a"})


def test_bad_assign() -> None:
    with pytest.raises(ConfigError, match="'assign'"):
        parse_options({"kafka.bootstrap.servers": "h", "assign": '{"t": ["x"]}'})


@pytest.mark.parametrize(
    ("records", "fetch_bytes"),
    [(1, 64 << 10), (25_000, 524_288), (32_768, 524_288), (10_000_000, 16 << 20)],
)
def test_a_tasks_fetch_is_sized_to_its_range(records: int, fetch_bytes: int) -> None:
    config = read._consumer_config(parse_options(BASE), KafkaRange("a", 0, 500, 500 + records))
    assert config["max.partition.fetch.bytes"] == str(fetch_bytes)
    rounded_up = 1 << (records - 1).bit_length()
    assert config["queued.min.messages"] == str(min(rounded_up, 10_000_000))
    assert config["fetch.queue.backoff.ms"] == "10"


def test_the_users_fetch_settings_win() -> None:
    options = parse_options(
        {**BASE, "kafka.max.partition.fetch.bytes": "123456", "kafka.queued.min.messages": "7"}
    )
    config = read._consumer_config(options, KafkaRange("a", 0, 0, 25_000))
    assert config["max.partition.fetch.bytes"] == "123456"
    assert config["queued.min.messages"] == "7"
