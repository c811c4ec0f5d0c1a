"""No credential reaches a repr, an error, a log line or a command line.

Table-driven: every case runs something a user does with a secret in an option
(parse it, print the options, connect to an unreachable or real server with it,
get it wrong), and the test captures everything that comes out: the repr and
str of what it returns, the exception with its whole chain and traceback, the
log records and the process's stdout and stderr. One last case runs a Spark
query in its own process and reads its whole output, Spark's log included.
"""

from __future__ import annotations

import json
import logging
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest

from eos_connectors.core.errors import EosError
from eos_connectors.core.secrets import redact, redact_options
from eos_connectors.dev.endpoints import Endpoints
from tests.redis_util import redis_server

pytestmark = [pytest.mark.services]

# Two words, so a message that quotes one of them out of context is caught too.
SECRET = "Xq9vK2 s3cr3tW0rd"
PIECES = ("Xq9vK2", "s3cr3tW0rd", quote(SECRET, safe=""))
ENCODED = quote(SECRET, safe="")
CLOSED_PORT = "127.0.0.1:1"
TWO_CLOSED = f"{CLOSED_PORT},127.0.0.1:2"
JAAS = (
    "org.apache.kafka.common.security.scram.ScramLoginModule required "
    f'username="eos" password="{SECRET}";'
)


def _leaks(text: str) -> list[str]:
    return [piece for piece in PIECES if piece in text]


def _pg_url(endpoints: Endpoints, host: str | None = None, query: bool = False) -> str:
    parts = urlsplit(endpoints.postgres_dsn)
    where = host or f"{parts.hostname}:{parts.port}"
    if query:
        return f"postgresql://{parts.username}@{where}{parts.path}?password={ENCODED}"
    return f"postgresql://{parts.username}:{ENCODED}@{where}{parts.path}"


def _pg_kv(endpoints: Endpoints, closing_quote: str = "'") -> str:
    parts = urlsplit(endpoints.postgres_dsn)
    return (
        f"host={parts.hostname} port={parts.port} user={parts.username} dbname={parts.path[1:]} "
        f"password='{SECRET}{closing_quote} connect_timeout=5"
    )


def _redis_url(endpoints: Endpoints, host: str | None = None, port: str | None = None) -> str:
    parts = urlsplit(endpoints.redis_url)
    return f"redis://:{ENCODED}@{host or parts.hostname}:{port or parts.port}/0"


def _pg_options(dsn: str, **extra: str) -> dict[str, str]:
    return {"dsn": dsn, "table": "secrets_t", "mode": "append", "createTable": "true", **extra}


def _redis_options(url: str, **extra: str) -> dict[str, str]:
    return {"url": url, "keyColumn": "word", "valueColumns": "count", **extra}


def _kafka_secrets(bootstrap: str) -> dict[str, str]:
    return {
        "kafka.bootstrap.servers": bootstrap,
        "kafka.security.protocol": "SASL_PLAINTEXT",
        "kafka.sasl.mechanism": "SCRAM-SHA-512",
        "kafka.sasl.username": "eos",
        "kafka.sasl.password": SECRET,
        "kafka.ssl.key.password": SECRET,
    }


def _shown(value: Any) -> str:
    return f"{value!r}\n{value}"


# Each case: what a user does, returning anything it produced (it may also raise).
def pg_options(dsn: Callable[[Endpoints], str]) -> Callable[[Endpoints], str]:
    def run(endpoints: Endpoints) -> str:
        from eos_connectors.sinks.postgres.options import parse_options

        return _shown(parse_options(_pg_options(dsn(endpoints))))

    return run


def pg_connect(dsn: Callable[[Endpoints], str]) -> Callable[[Endpoints], str]:
    def run(endpoints: Endpoints) -> str:
        from eos_connectors.sinks.postgres.connection import connect
        from eos_connectors.sinks.postgres.options import parse_options

        connect(parse_options(_pg_options(dsn(endpoints)))).close()
        return "connected"

    return run


def pg_bad_mode(endpoints: Endpoints) -> str:
    from eos_connectors.sinks.postgres.options import parse_options

    return _shown(parse_options(_pg_options(_pg_url(endpoints), mode="merge")))


def redis_options(url: Callable[[Endpoints], str]) -> Callable[[Endpoints], str]:
    def run(endpoints: Endpoints) -> str:
        from eos_connectors.sinks.redis.options import parse_options

        return _shown(parse_options(_redis_options(url(endpoints))))

    return run


def redis_connect(url: Callable[[Endpoints], str]) -> Callable[[Endpoints], str]:
    def run(endpoints: Endpoints) -> str:
        from eos_connectors.sinks.redis.connection import connect
        from eos_connectors.sinks.redis.options import parse_options

        connect(parse_options(_redis_options(url(endpoints)))).close()
        return "connected"

    return run


def redis_wrong_password(endpoints: Endpoints, tmp: Path) -> str:
    """A server that requires another password than the one given."""
    server = redis_server(tmp, password=f"right-{uuid.uuid4().hex}")
    client = next(server)
    try:
        port = str(client.connection_pool.connection_kwargs["port"])
        return redis_connect(lambda e: _redis_url(e, host="127.0.0.1", port=port))(endpoints)
    finally:
        server.close()


def redis_bad_mode(endpoints: Endpoints) -> str:
    from eos_connectors.sinks.redis.options import parse_options

    return _shown(parse_options(_redis_options(_redis_url(endpoints), mode="merge")))


def kafka_source_options(endpoints: Endpoints) -> str:
    from eos_connectors.sources.kafka.options import parse_options

    options = {**_kafka_secrets(endpoints.kafka_bootstrap), "kafka.sasl.jaas.config": JAAS}
    return _shown(parse_options({**options, "subscribe": "t"}))


def kafka_source_bad_option(endpoints: Endpoints) -> str:
    from eos_connectors.sources.kafka.options import parse_options

    options = _kafka_secrets(endpoints.kafka_bootstrap)
    return _shown(parse_options({**options, "subscribe": "t", "maxOffsetsPerTrigger": "many"}))


def kafka_source_unreachable(endpoints: Endpoints) -> str:
    from eos_connectors.sources.kafka.broker import BrokerView
    from eos_connectors.sources.kafka.options import parse_options

    options = {**_kafka_secrets(CLOSED_PORT), "subscribe": "t"}
    view = BrokerView(parse_options({**options, "kafkaConsumer.pollTimeoutMs": "2000"}))
    return _shown(view.partitions())


def kafka_sink_options(endpoints: Endpoints) -> str:
    from eos_connectors.sinks.kafka import parse_options

    return _shown(parse_options({**_kafka_secrets(endpoints.kafka_bootstrap), "topic": "t"}))


def kafka_sink_bad_option(endpoints: Endpoints) -> str:
    from eos_connectors.sinks.kafka import parse_options

    options = {
        **_kafka_secrets(endpoints.kafka_bootstrap),
        "topic": "t",
        "deliveryGuarantee": "maybe",
    }
    return _shown(parse_options(options))


def endpoints_described(endpoints: Endpoints) -> str:
    with_secrets = Endpoints(endpoints.kafka_bootstrap, _pg_url(endpoints), _redis_url(endpoints))
    return with_secrets.describe()


def verify_sink_option(endpoints: Endpoints) -> str:
    from eos_connectors.dev.harness.command import _sink_options

    return _shown(_sink_options([f"password={SECRET}"], None))


def verify_sink_url_option(endpoints: Endpoints) -> str:
    from eos_connectors.dev.harness.command import _sink_options

    return _shown(_sink_options([f"url={_redis_url(endpoints)}"], None))


def verify_custom_sink(endpoints: Endpoints, tmp: Path) -> str:
    """A custom sink's options from a file: its repr and the report's plan mask them."""
    from eos_connectors.dev.harness.command import _sink_options
    from eos_connectors.dev.harness.verify import CustomSink

    path = tmp / "options.json"
    path.write_text(json.dumps({"dsn": _pg_url(endpoints), "api.token": SECRET}))
    custom = CustomSink("my_sink", "m:f", _sink_options(["table=t"], str(path)))
    assert dict(custom.options)["api.token"] == SECRET  # the sink itself gets the secret
    return f"{custom!r}\n{json.dumps(custom.public())}"


def harness_and_bench_command_lines(endpoints: Endpoints, tmp: Path) -> str:
    """What `ps` shows of the processes the harness and the benchmark start."""
    from eos_connectors.dev.compare import pipelines as pl

    with_secrets = Endpoints(endpoints.kafka_bootstrap, _pg_url(endpoints), _redis_url(endpoints))
    lines = []
    for pipeline in pl.PIPELINES:
        target = pl.Target(pipeline, "input", "run", tmp / pipeline.key)
        target.state_dir.mkdir(parents=True)
        argv = pl.command(target, with_secrets, 1000)
        if argv[-1].endswith(".json"):  # the harness's pipeline reads its options from here
            spec = Path(argv[-1])
            assert spec.stat().st_mode & 0o077 == 0, f"{spec} is readable by others"
        lines.append(" ".join(argv))
        if argv[-1].endswith(".json"):
            from eos_connectors.dev.harness.spec import PipelineSpec

            lines.append(repr(PipelineSpec.read(Path(argv[-1]))))  # a spec in a log line
    return "\n".join(lines)


CASES: dict[str, Callable[..., str]] = {
    "pg-options-url": pg_options(_pg_url),
    "pg-options-url-query": pg_options(lambda e: _pg_url(e, query=True)),
    "pg-options-multi-host": pg_options(lambda e: _pg_url(e, host=TWO_CLOSED)),
    "pg-options-key-value-quoted": pg_options(_pg_kv),
    "pg-malformed-dsn": pg_options(lambda e: _pg_kv(e, closing_quote="")),
    "pg-bad-option-value": pg_bad_mode,
    "pg-unreachable": pg_connect(lambda e: _pg_url(e, host=CLOSED_PORT)),
    "pg-unreachable-multi-host": pg_connect(
        lambda e: _pg_url(e, host=f"{CLOSED_PORT},127.0.0.1:2")
    ),
    "pg-wrong-password": pg_connect(_pg_url),
    "pg-wrong-password-key-value": pg_connect(_pg_kv),
    "redis-options": redis_options(_redis_url),
    "redis-bad-port": redis_options(lambda e: _redis_url(e, port="six")),
    "redis-bad-scheme": redis_options(lambda e: "http" + _redis_url(e)[5:]),
    "redis-bad-option-value": redis_bad_mode,
    "redis-unreachable": redis_connect(lambda e: _redis_url(e, host="127.0.0.1", port="1")),
    "redis-wrong-password": redis_wrong_password,
    "kafka-source-options": kafka_source_options,
    "kafka-source-bad-option-value": kafka_source_bad_option,
    "kafka-source-unreachable": kafka_source_unreachable,
    "kafka-sink-options": kafka_sink_options,
    "kafka-sink-bad-option-value": kafka_sink_bad_option,
    "endpoints-described": endpoints_described,
    "verify-sink-option-password": verify_sink_option,
    "verify-sink-option-url": verify_sink_url_option,
    "verify-custom-sink-options-file": verify_custom_sink,
    "harness-and-bench-command-lines": harness_and_bench_command_lines,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_no_secret_in_anything_a_case_shows(
    case: str,
    endpoints: Endpoints,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    run = CASES[case]
    needs_tmp = run.__code__.co_argcount == 2
    caplog.set_level(logging.DEBUG)
    shown = []
    try:
        shown.append(run(endpoints, tmp_path) if needs_tmp else run(endpoints))
    except (EosError, SystemExit, Exception) as exc:
        shown.append("".join(traceback.format_exception(exc)))
    out, err = capfd.readouterr()
    everything = "\n".join([*shown, caplog.text, out, err])
    assert everything.strip(), f"{case} showed nothing: the case did not run"
    assert _leaks(everything) == [], f"{case} shows the secret:\n{everything}"


def test_the_errors_still_say_what_is_wrong(endpoints: Endpoints) -> None:
    """Redaction keeps the useful part of each message."""
    from eos_connectors.sinks.postgres.options import parse_options

    with pytest.raises(EosError, match="Option 'dsn' is not a valid libpq connection string"):
        parse_options(_pg_options(_pg_kv(endpoints, closing_quote="")))
    with pytest.raises(EosError, match="password authentication failed") as failure:
        pg_connect(_pg_url)(endpoints)
    assert "postgresql://eos:***@" in str(failure.value)
    with pytest.raises(SystemExit, match="--sink-options-file"):
        verify_sink_option(endpoints)
    assert redact_options({"kafka.sasl.password": SECRET, "topic": "t"}) == {
        "kafka.sasl.password": "***",
        "topic": "t",
    }
    assert redact(f"password='{SECRET}' host=h") == "password=*** host=h"
