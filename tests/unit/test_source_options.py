from __future__ import annotations

import json

import pytest

from eos_connectors.core.errors import ConfigError
from eos_connectors.sources.kafka import fetch
from eos_connectors.sources.kafka.offsets import KafkaRange
from eos_connectors.sources.kafka.options import (
    check_for_batch,
    check_for_stream,
    parse_options,
    warn_ignored,
)

BASE = {"kafka.bootstrap.servers": "h:9092", "subscribe": "a,b"}


def test_defaults_match_sparks_kafka_source() -> None:
    options = parse_options(BASE)
    assert options.topics == ("a", "b")
    assert options.starting_offsets is None  # a stream starts at latest, a batch at earliest
    assert options.ending_offsets is None and options.ending_timestamps is None
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
        ({"maxOffsetsPerTrigger": "lots"}, "'maxOffsetsPerTrigger' must be a whole number"),
        ({"failOnDataLoss": "maybe"}, "'failOnDataLoss' must be true or false"),
        ({"endingOffsets": "{nope"}, "'endingOffsets' is not valid JSON"),
        ({"endingTimestamp": "1", "endingOffsetsByTimestamp": "{}"}, "only one of"),
        ({"endingTimestamp": "-5"}, "'endingTimestamp' must be >= 0"),
        ({"minOffsetsPerTrigger": "0"}, "'minOffsetsPerTrigger' must be >= 1"),
        ({"maxTriggerDelay": "soon"}, "'maxTriggerDelay' must be a duration"),
        ({"maxRecordsPerPartition": "0"}, "'maxRecordsPerPartition' must be >= 1"),
        ({"fetchOffset.numRetries": "-1"}, "'fetchOffset.numRetries' must be >= 0"),
        ({"subscribePatern": "x"}, "Unknown option 'subscribepatern'"),
        ({"kafka.enable.auto.commit": "true"}, "offsets live in Spark's checkpoint"),
        ({"kafka.auto.offset.reset": "earliest"}, "use startingOffsets"),
        ({"kafka.isolation.level": "dirty"}, "'kafka.isolation.level' must be"),
        ({"startingTimestamp": "1", "startingOffsetsByTimestamp": "{}"}, "only one of"),
        ({"maxPartitions": "0"}, "'maxPartitions' must be >= 1"),
        ({"minPartitions": "8", "maxPartitions": "2"}, r"'minPartitions' \(8\) is above"),
        (
            {"minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"},
            r"'minOffsetsPerTrigger' \(10\) is above 'maxOffsetsPerTrigger' \(5\)",
        ),
        ({"startingOffsets": '{"a": {"0": true}}'}, "must be an integer >= -2, got True"),
        ({"endingOffsets": '{"a": {"0": false}}'}, "must be an integer >= -2, got False"),
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
    config = fetch._consumer_config(parse_options(BASE), KafkaRange("a", 0, 500, 500 + records))
    assert config["max.partition.fetch.bytes"] == str(fetch_bytes)
    rounded_up = 1 << (records - 1).bit_length()
    assert config["queued.min.messages"] == str(min(rounded_up, 10_000_000))
    assert config["fetch.queue.backoff.ms"] == "10"


def test_the_users_fetch_settings_win() -> None:
    options = parse_options(
        {**BASE, "kafka.max.partition.fetch.bytes": "123456", "kafka.queued.min.messages": "7"}
    )
    config = fetch._consumer_config(options, KafkaRange("a", 0, 0, 25_000))
    assert config["max.partition.fetch.bytes"] == "123456"
    assert config["queued.min.messages"] == "7"


def test_options_spark_jobs_carry_are_taken() -> None:
    """minOffsetsPerTrigger with maxTriggerDelay (Spark's duration form), maxRecordsPerPartition,
    fetchOffset.*, and kafka.group.id (the consumers' group, as given; never committed to)."""
    options = parse_options(
        {
            **BASE,
            "minOffsetsPerTrigger": "500",
            "maxTriggerDelay": "30s",
            "maxRecordsPerPartition": "1000",
            "fetchOffset.numRetries": "5",
            "fetchOffset.retryIntervalMs": "20",
            "kafka.group.id": "team-a",
        }
    )
    assert (options.min_offsets_per_trigger, options.max_trigger_delay_ms) == (500, 30_000)
    assert options.max_records_per_partition == 1000
    assert (options.fetch_offset_retries, options.fetch_offset_retry_interval_ms) == (5, 20)
    config = fetch._consumer_config(options, KafkaRange("a", 0, 0, 10))
    assert config["group.id"] == "team-a" and "group.id" not in options.client_config()
    assert parse_options(BASE).max_trigger_delay_ms == 15 * 60 * 1000  # Spark's default


def test_max_records_per_partition_splits_ranges_and_is_recorded_with_the_batch() -> None:
    from eos_connectors.sources.kafka.offsets import SourceOffset, Split, plan_ranges

    start, end = {("a", 0): 0, ("a", 1): 0}, {("a", 0): 2500, ("a", 1): 300}
    sizes = [r.size for r in plan_ranges(start, end, None, 1000)]
    assert sizes == [833, 833, 834, 300]
    offset = SourceOffset(end, split=Split(None, None, 1000))
    assert SourceOffset.from_spark(offset.to_spark()).split == Split(None, None, 1000)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"startingOffsets": "latest"}, "'startingOffsets' cannot be latest"),
        ({"startingOffsets": '{"a": {"0": -1}}'}, "'startingOffsets' cannot be latest"),
        ({"endingOffsets": "earliest"}, "'endingOffsets' cannot be earliest"),
        ({"endingOffsets": '{"a": {"0": -2}}'}, "'endingOffsets' cannot be earliest"),
        (
            {"startingOffsets": '{"a": {"0": 5}}', "endingOffsets": '{"a": {"1": 9}}'},
            "must name the same partitions; a-0, a-1 differ",
        ),
        (
            {"startingOffsets": '{"a": {"0": 9}}', "endingOffsets": '{"a": {"0": 5}}'},
            "a-0 starts at 9, after its end 5",
        ),
    ],
)
def test_a_batch_read_refuses_what_spark_refuses(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_for_batch(parse_options({**BASE, **extra}))


def test_a_batch_read_takes_its_bounds_and_a_stream_refuses_them() -> None:
    options = parse_options(
        {**BASE, "startingOffsets": '{"a": {"0": -2}}', "endingOffsets": '{"a": {"0": 40}}'}
    )
    check_for_batch(options)
    assert options.ending_offsets == {"a": {0: 40}}
    stamped = parse_options({**BASE, "endingTimestamp": "1700000000000"})
    assert stamped.ending_timestamps == 1_700_000_000_000
    check_for_batch(stamped)
    with pytest.raises(ConfigError, match="apply to batch reads"):
        check_for_stream(stamped, {})
    check_for_stream(parse_options(BASE), BASE)


@pytest.mark.parametrize(
    "name", ["maxOffsetsPerTrigger", "MINOFFSETSPERTRIGGER", "maxTriggerDelay"]
)
def test_admission_control_is_refused_before_pyspark_4_2_naming_the_option_and_release(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before 4.2 Spark hands a Python source no read limit: a bounded batch would read all,
    and availableNow stopped after one batch. Costs ~0 s."""
    from eos_connectors.core import spark_api
    from eos_connectors.sources.kafka import options as source_options

    given = {**BASE, name: "10" if "Delay" not in name else "5s"}
    if spark_api.HAS_READ_LIMITS:
        source_options.check_for_stream(parse_options(given), given)
    monkeypatch.setattr(source_options, "HAS_READ_LIMITS", False)
    monkeypatch.setattr(source_options, "release", lambda: "4.1.4")
    with pytest.raises(
        ConfigError, match=rf"(?i)'{name}' needs PySpark 4.2 or later: PySpark 4.1.4"
    ):
        source_options.check_for_stream(parse_options(given), given)


def test_offsets_behind_latest_are_computed_from_a_progress_as_spark_reports_them() -> None:
    from eos_connectors.sources.kafka.metrics import offsets_behind_latest

    source = {
        "endOffset": json.dumps({"t": {"0": 90, "1": 40}, "@split": {"minPartitions": None}}),
        "latestOffset": {"t": {"0": 100, "1": 40}, "u": {"0": 7}},  # u: not in the batch
    }
    assert offsets_behind_latest(source) == {
        "minOffsetsBehindLatest": 0.0,
        "maxOffsetsBehindLatest": 10.0,
        "avgOffsetsBehindLatest": 5.0,
    }
    assert offsets_behind_latest({"endOffset": "12", "latestOffset": None}) is None  # rate
    assert offsets_behind_latest({"endOffset": None}) is None
    # PySpark 4.0's progress objects (the listener's too) give str() of the parsed offsets.
    as_4_0 = {k: str(json.loads(v) if isinstance(v, str) else v) for k, v in source.items()}
    assert "'t'" in as_4_0["endOffset"]
    assert offsets_behind_latest(as_4_0) == offsets_behind_latest(source)
    assert (
        offsets_behind_latest({"endOffset": "{'t': __import__('os')}", "latestOffset": "{}"})
        is None
    )
    assert offsets_behind_latest({"endOffset": "{'t': ", "latestOffset": "{}"}) is None


def test_what_sparks_source_ignores_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    given = {
        **BASE,
        "kafka.group.id": "mine",
        "groupIdPrefix": "eos-x",
        "maxTriggerDelay": "5m",
        "publishOffsetsToGroup": "true",
    }
    with caplog.at_level("WARNING", logger="eos_connectors.sources.kafka.options"):
        warn_ignored(given, parse_options(given), batch=False)
    assert [r.getMessage() for r in caplog.records] == [
        "eos_kafka: option 'groupIdPrefix' is ignored: 'kafka.group.id' is set."
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="eos_connectors.sources.kafka.options"):
        warn_ignored(given, parse_options(given), batch=True)
    assert {r.getMessage() for r in caplog.records} >= {
        "eos_kafka: option 'maxTriggerDelay' is ignored in a batch read (streams only).",
        "eos_kafka: option 'publishOffsetsToGroup' is ignored in a batch read (streams only).",
    }


@pytest.mark.parametrize(
    ("given", "ms"),
    [
        ("15m", 900_000),
        ("15min", 900_000),
        ("30s", 30_000),
        ("500", 500),
        ("1500us", 1),
        ("2h", 7_200_000),
    ],
)
def test_durations_take_sparks_suffixes(given: str, ms: int) -> None:
    assert parse_options({**BASE, "maxTriggerDelay": given}).max_trigger_delay_ms == ms
