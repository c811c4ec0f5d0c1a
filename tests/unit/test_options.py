"""Options declared once: the docs pages list exactly the declared options, the options every
sink shares are refused alike, and a Kafka client's settings are one dict from the option to
the client. Cost: under 1 s."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from eos_connectors.core import batch_job, kafka_config
from eos_connectors.core import options as opt
from eos_connectors.core.errors import ConfigError
from eos_connectors.dev import docs
from eos_connectors.sinks.kafka.options import parse_options as kafka_sink
from eos_connectors.sinks.postgres.options import parse_options as postgres_sink
from eos_connectors.sinks.redis.options import parse_options as redis_sink
from eos_connectors.sources.kafka.options import parse_options as kafka_source

DOCS = Path(__file__).resolve().parents[2] / "docs"
SINKS: dict[str, tuple[Callable[[Mapping[str, str]], Any], dict[str, str]]] = {
    "kafka": (kafka_sink, {"kafka.bootstrap.servers": "h:9092", "topic": "t"}),
    "postgres": (postgres_sink, {"dsn": "postgresql://u@h/db", "table": "t"}),
    "redis": (redis_sink, {"url": "redis://h:6379/0", "keyColumn": "k", "valueColumns": "v"}),
}


def test_every_docs_page_shows_its_connectors_declared_options() -> None:
    assert docs.stale(DOCS) == [], "run: python -m eos_connectors.dev.docs"


@pytest.mark.parametrize(("page", "name"), sorted(docs.PAGES))
def test_a_docs_page_lists_exactly_the_declared_options(page: str, name: str) -> None:
    """Read as a user reads it: the first column of the page's options table."""
    text = (DOCS / page).read_text()
    block = text.split(f"<!-- options: {name} -->", 1)[1].split("<!-- /options -->", 1)[0]
    listed = re.findall(r"^\| `([^`]+)` \|", block, re.M)
    table = docs.table_of(docs.PAGES[(page, name)])
    assert listed == [*table.names, *(f"{p}*" for p in table.passthrough)]


@pytest.mark.parametrize("sink", sorted(SINKS))
@pytest.mark.parametrize("bad", ["", " a", "a|b", "a{b}", "x" * 65, "tab\there"])
def test_every_sink_refuses_the_same_sink_ids(sink: str, bad: str) -> None:
    """The Kafka sink used to take sinkId="" and fall back to a derived id in silence."""
    parse, base = SINKS[sink]
    with pytest.raises(ConfigError, match="Option 'sinkId' must be 1-64 printable"):
        parse({**base, "sinkId": bad})


@pytest.mark.parametrize("sink", sorted(SINKS))
def test_every_sink_takes_the_same_sink_ids(sink: str) -> None:
    parse, base = SINKS[sink]
    assert parse({**base, "sinkId": "orders-daily.v2"}).sink_id == "orders-daily.v2"


@pytest.mark.parametrize("text", ["١٢٣", "1_000", "+5", "-1", "12a", "", str(2**63)])
def test_txn_version_takes_ascii_digits_only_and_refuses_within_the_error_root(text: str) -> None:
    """``"١٢٣".isdigit()`` is true and ``int()`` takes it: the old check let it through."""
    with pytest.raises(ConfigError, match="txnVersion"):
        batch_job.batch_job({"txnVersion": text or "x"}, "eos_x", True, "job")


@pytest.mark.parametrize("sink", sorted(SINKS))
def test_every_sink_refuses_an_unknown_option_listing_the_known_ones(sink: str) -> None:
    parse, base = SINKS[sink]
    with pytest.raises(ConfigError, match=r"Unknown option 'sinkid2' .*Known options: .*sinkId"):
        parse({**base, "sinkId2": "x"})


@pytest.mark.parametrize("sink", sorted(SINKS))
def test_every_sink_refuses_asynchronous_progress_tracking(sink: str) -> None:
    parse, base = SINKS[sink]
    with pytest.raises(ConfigError, match="asyncProgressTrackingEnabled"):
        parse({**base, "asyncProgressTrackingEnabled": "true"})


def test_a_declared_default_is_written_once() -> None:
    source = kafka_source({"kafka.bootstrap.servers": "h", "subscribe": "t"})
    table = __import__("eos_connectors.sources.kafka.options", fromlist=["OPTIONS"]).OPTIONS
    assert source.poll_timeout_ms == table["kafkaConsumer.pollTimeoutMs"].default
    assert source.group_id_prefix == table["groupIdPrefix"].default


def test_an_option_table_refuses_a_name_declared_twice() -> None:
    twice = [opt.Option("a", opt.text, ""), opt.Option("A", opt.text, "")]
    with pytest.raises(ValueError, match="declared twice"):
        opt.OptionTable("x", twice)


# -- Kafka client settings: one dict from the option to the client --------------------------


def test_the_bootstrap_servers_stay_in_the_one_settings_dict() -> None:
    options = kafka_sink(
        {
            "kafka.bootstrap.servers": "a:1,b:2",
            "topic": "t",
            "kafka.security.protocol": "SASL_PLAINTEXT",
            "kafka.sasl.mechanism": "PLAIN",
            "kafka.sasl.username": "u",
            "kafka.sasl.password": "p",
            "kafka.linger.ms": "7",
        }
    )
    assert options.kafka["bootstrap.servers"] == "a:1,b:2"
    assert options.bootstrap_servers == "a:1,b:2"
    assert options.client_config() == {
        "bootstrap.servers": "a:1,b:2",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "u",
        "sasl.password": "p",
    }
    assert options.producer_config()["linger.ms"] == "7"
    source = kafka_source({"kafka.bootstrap.servers": "a:1", "subscribe": "t"})
    assert source.client_config()["bootstrap.servers"] == "a:1"


def test_java_security_settings_are_translated_in_one_place() -> None:
    jaas = (
        "org.apache.kafka.common.security.plain.PlainLoginModule required "
        'username="u" password="p";'
    )
    settings = kafka_config.from_options(
        {"kafka.bootstrap.servers": "h:1", "kafka.sasl.jaas.config": jaas}, {}
    )
    assert (settings["sasl.username"], settings["sasl.password"]) == ("u", "p")
    assert "sasl.jaas.config" not in settings
    assert kafka_config.connection(settings)["sasl.password"] == "p"


def test_a_missing_bootstrap_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigError, match=r"'kafka\.bootstrap\.servers' is required"):
        kafka_config.from_options({"kafka.linger.ms": "5"}, {})


@pytest.mark.parametrize(
    ("given", "parts"),
    [
        ("orders", ("orders",)),
        ("Sales.Orders", ("Sales", "Orders")),
        ('"Sales"."Orders"', ("Sales", "Orders")),  # a JDBC dbtable's spelling
        ('Sales."Q1.orders"', ("Sales", "Q1.orders")),
        ('"a""b".c', ('a"b', "c")),
        ('x"; DROP TABLE t; --', ('x"; DROP TABLE t; --',)),  # as written: quoted by the sink
    ],
)
def test_the_postgres_table_is_read_as_sql_spells_it(given: str, parts: tuple[str, ...]) -> None:
    """Each part is taken as written; SQL's double quotes hold a dot (before, a quoted
    name was one identifier, quotes and all: "does not exist", naming what was typed)."""
    assert postgres_sink({"dsn": "postgresql://u@h/db", "table": given}).table == parts


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("db.sales.orders", "more than schema.name"),
        ('"sales', "never closed"),
        ('"sales"x', "right after a closing quote"),
        ("sales.", "an empty part"),
    ],
)
def test_a_malformed_postgres_table_is_refused_saying_why(given: str, why: str) -> None:
    with pytest.raises(ConfigError) as refused:
        postgres_sink({"dsn": "postgresql://u@h/db", "table": given})
    assert "Option 'table' must be name or schema.name" in str(refused.value)
    assert why in str(refused.value)
