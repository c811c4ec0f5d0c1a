"""The source and the sink in Spark queries over SASL: librdkafka's settings, and a Java
job's (a JAAS login and a PKCS#12 truststore) over SASL_SSL; over mutual TLS (a Java
job's PKCS#12 keystore); over OAUTHBEARER (OIDC); and as a user holding only the ACLs
docs/deploy.md lists.

Cost: ~32 s.
"""

from __future__ import annotations

import json
from contextlib import suppress
from pathlib import Path

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from eos_connectors.core.topics import create_topic, read_to_end
from eos_connectors.dev.endpoints import Endpoints, KafkaSasl
from tests.kafka_acl_util import READ, TOPIC, Grant, Principal, sink_grants, source_grants
from tests.kafka_util import produce_plain, uncommit
from tests.oauth_util import token_endpoint
from tests.services.test_kafka_sasl import _values

pytestmark = [pytest.mark.services, pytest.mark.spark]


@pytest.fixture
def sasl_ssl(sasl: KafkaSasl) -> KafkaSasl:
    if not sasl.ssl_bootstrap:
        pytest.skip("this broker has no SASL_SSL listener; `eos stack up` starts one")
    return sasl


@pytest.mark.cost(4)
def test_source_and_sink_in_spark_over_sasl(
    spark: SparkSession, endpoints: Endpoints, sasl: KafkaSasl, unique: str, tmp_path: Path
) -> None:
    """eos_kafka (SASL) -> eos_kafka sink (SASL), exactly once across a replayed batch."""
    source, out = f"sasl-in-{unique}", f"sasl-out-{unique}"
    create_topic(sasl.client_config(), source, 2)
    create_topic(sasl.client_config(), out, 2)
    values = [f"v{i}".encode() for i in range(200)]
    produce_plain(endpoints.kafka_bootstrap, source, values)
    checkpoint = tmp_path / "ck"

    def run() -> None:
        reader = spark.readStream.format("eos_kafka").options(**sasl.options())
        rows = reader.option("subscribe", source).option("startingOffsets", "earliest").load()
        query = (
            rows.select("key", "value")
            .writeStream.format("eos_kafka")
            .options(**sasl.options())
            .option("topic", out)
            .option("sinkId", f"sasl-{unique}")
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()

    run()
    assert _values(endpoints, out) == sorted(values)
    last = max(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    uncommit(checkpoint, last)  # crashed after the sink committed
    run()  # replays the batch: every task finds its marker over SASL and writes nothing
    assert _values(endpoints, out) == sorted(values)
    offsets = json.loads((checkpoint / "offsets" / str(last)).read_text().splitlines()[-1])
    assert offsets[source] == {"0": _count(endpoints, source, 0), "1": _count(endpoints, source, 1)}


def _count(endpoints: Endpoints, topic: str, partition: int) -> int:
    return sum(1 for r in read_to_end(endpoints.kafka, topic) if r.partition == partition)


@pytest.mark.cost(4)
def test_a_java_jobs_security_settings_run_a_pipeline_over_sasl_ssl(
    spark: SparkSession, endpoints: Endpoints, sasl_ssl: KafkaSasl, unique: str, tmp_path: Path
) -> None:
    """The settings a Java Spark job carries (a SCRAM JAAS login, a PKCS#12 truststore
    with its password) taken unchanged: a stream and a batch read, and the exactly-once
    sink with its markers, over TLS with the broker's host name checked."""
    source, out, values = _topics(endpoints, f"tls-{unique}")
    java = sasl_ssl.java_options()
    query = _copied(spark, java, source, out, f"tls-{unique}", tmp_path / "ck")
    assert query.exception() is None, query.exception()
    assert _values(endpoints, out) == sorted(values)
    batch = spark.read.format("eos_kafka").options(**java).option("subscribe", out).load()
    assert sorted(bytes(r["value"]) for r in batch.collect()) == sorted(values)
    # a truststore that is not there: a clear error naming the option, on the driver
    untrusted = {**java, "kafka.ssl.truststore.location": str(tmp_path / "none.p12")}
    with pytest.raises(Exception, match="cannot read"):
        spark.read.format("eos_kafka").options(**untrusted).option("subscribe", out).load()


@pytest.mark.cost(7)
def test_the_acls_the_docs_list_run_a_query_and_a_missing_one_is_named_at_start(
    spark: SparkSession, endpoints: Endpoints, sasl: KafkaSasl, unique: str, tmp_path: Path
) -> None:
    """A principal holding only the ACLs docs/deploy.md lists runs a stream from the
    source (READ on its topic, no consumer group: librdkafka's look-up of the group's
    coordinator, refused, failed every read task) to the sink in the default mode,
    exactly once, and a batch read; one without READ on the sink's
    topic (where its markers are group offsets) fails at its start naming that ACL,
    instead of in every task of its first batch."""
    source, out, values = _topics(endpoints, f"acl-{unique}")

    def run(sink_id: str, principal: Principal) -> StreamingQuery:
        options = principal.sasl.options()
        return _copied(spark, options, source, out, sink_id, tmp_path / sink_id)

    log = "eos-sink-markers"
    granted = Principal(
        endpoints, sasl, [*source_grants(source), *sink_grants(f"s1-{unique}", out, log)]
    )
    query = run(f"s1-{unique}", granted)
    assert query.exception() is None, query.exception()
    assert _values(endpoints, out) == sorted(values)
    batch = spark.read.format("eos_kafka").options(**granted.sasl.options())
    assert batch.option("subscribe", source).load().count() == len(values)
    unread = [g for g in sink_grants(f"s2-{unique}", out, log) if g != Grant(TOPIC, out, READ)]
    query = run(f"s2-{unique}", Principal(endpoints, sasl, [*source_grants(source), *unread]))
    failed = str(query.exception())
    assert f"READ (besides WRITE) on topic '{out}'" in failed, failed
    assert "stage failure" not in failed, "the driver's start refused it, no task ran"


@pytest.mark.cost(7)
def test_a_java_jobs_mutual_tls_settings_run_a_pipeline_in_the_default_mode(
    spark: SparkSession, endpoints: Endpoints, sasl: KafkaSasl, unique: str, tmp_path: Path
) -> None:
    """Mutual TLS, as a Java job sets it (a PKCS#12 keystore with the client's
    certificate, a PKCS#12 truststore): the source, the tasks' transactions and the
    driver's batch commit all sign in with the client certificate (the driver's
    kafka-python client refused the keystore, and the query had to fall back to
    commitMode=task); a keystore that does not open is named at the start."""
    if not sasl.mtls_bootstrap:
        pytest.skip("this broker has no mutual TLS listener; `eos stack up` starts one")
    source, out, values = _topics(endpoints, f"mtls-{unique}")
    mtls = sasl.mtls_options()
    query = _copied(spark, mtls, source, out, f"mtls-{unique}", tmp_path / "ck")
    assert query.exception() is None, query.exception()
    assert _values(endpoints, out) == sorted(values)
    wrong = {**mtls, "kafka.ssl.keystore.password": "not-it"}
    with pytest.raises(Exception, match=r"option .kafka.ssl.keystore.location."):
        (
            spark.range(1)
            .selectExpr("'v' as value")
            .write.format("eos_kafka")
            .options(**wrong)
            .option("topic", out)
            .option("sinkId", f"mtls-job-{unique}")
            .option("txnVersion", "1")
            .mode("append")
            .save()
        )


@pytest.mark.cost(7)
def test_an_oauthbearer_oidc_login_runs_a_pipeline_in_the_default_mode(
    spark: SparkSession, endpoints: Endpoints, sasl: KafkaSasl, unique: str, tmp_path: Path
) -> None:
    """OAUTHBEARER over OIDC (the client credentials grant, as Confluent Cloud, Strimzi
    with Keycloak and Redpanda take), the source with librdkafka's settings and the sink
    with a Java job's (JAAS and Kafka's OIDC login handler): the source, the tasks'
    transactions and the driver's batch commit each get a token from the endpoint and
    sign in with it (the driver's client refused the mechanism, and the query had to
    fall back to commitMode=task; a Java job's OAuth login was refused outright)."""
    if not sasl.oauth_bootstrap:
        pytest.skip("this broker has no OAUTHBEARER listener; `eos stack up` starts one")
    source, out, values = _topics(endpoints, f"oauth-{unique}")
    with token_endpoint() as idp:
        options = idp.options(sasl.oauth_bootstrap)
        java = idp.java_options(sasl.oauth_bootstrap)
        query = _copied(spark, options, source, out, f"oauth-{unique}", tmp_path / "ck", java)
    assert query.exception() is None, query.exception()
    assert _values(endpoints, out) == sorted(values)
    assert idp.requests, "no client asked for a token"


def _copied(
    spark: SparkSession,
    options: dict[str, str],
    source: str,
    out: str,
    sink_id: str,
    ck: Path,
    sink_options: dict[str, str] | None = None,
) -> StreamingQuery:
    """A stream of ``source``'s records into ``out`` through the sink ``sink_id`` in the
    default mode, both ends with ``options`` (the sink with ``sink_options`` when given),
    run to its end (its error, if any, kept)."""
    rows = (
        spark.readStream.format("eos_kafka")
        .options(**options)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = (
        rows.select("key", "value")
        .writeStream.format("eos_kafka")
        .options(**(sink_options or options))
        .option("topic", out)
        .option("sinkId", sink_id)
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    with suppress(StreamingQueryException):  # read by the caller
        query.awaitTermination(300)
    return query


def _topics(endpoints: Endpoints, name: str) -> tuple[str, str, list[bytes]]:
    """A source topic holding 100 records and an empty output topic, two partitions each;
    and the records' values."""
    source, out = f"{name}-in", f"{name}-out"
    create_topic(endpoints.kafka, source, 2)
    create_topic(endpoints.kafka, out, 2)
    values = [f"v{i}".encode() for i in range(100)]
    produce_plain(endpoints.kafka_bootstrap, source, values)
    return source, out, values
