"""A Java job's security settings in librdkafka's terms: JAAS logins, PKCS#12 and PEM
stores (a real keytool makes the truststores), JKS refused with the command that converts it, and
no password in any error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from eos_connectors.core.errors import ConfigError
from eos_connectors.core.java_security import translate
from eos_connectors.sources.kafka.options import parse_options

SECRET = "s3cr3t-pa55"
PLAIN = (
    'org.apache.kafka.common.security.plain.PlainLoginModule required username="app" password="{}";'
)
SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule required username=app password={};"


def test_a_plain_login_becomes_librdkafkas_username_and_password() -> None:
    out = translate({"security.protocol": "SASL_SSL", "sasl.jaas.config": PLAIN.format(SECRET)})
    assert out == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "app",
        "sasl.password": SECRET,
    }
    quoted = PLAIN.replace('"app"', r'"a\"pp"').format(SECRET)
    assert translate({"sasl.jaas.config": quoted})["sasl.username"] == 'a"pp'


def test_a_scram_login_needs_the_mechanism_the_brokers_expect() -> None:
    out = translate({"sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": SCRAM.format(SECRET)})
    assert (out["sasl.username"], out["sasl.password"]) == ("app", SECRET)
    with pytest.raises(ConfigError, match="SCRAM-SHA-256 or SCRAM-SHA-512") as caught:
        translate({"sasl.jaas.config": SCRAM.format(SECRET)})
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("jaas", "message"),
    [
        (
            "com.sun.security.auth.module.Krb5LoginModule required useKeyTab=true;",
            "kafka.sasl.kerberos.keytab",
        ),
        (
            "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;",
            "needs unsecuredLoginStringClaim_sub",
        ),
        ("com.example.Custom required password=" + SECRET + ";", "is not one librdkafka"),
        ("org.apache.kafka.common.security.plain.PlainLoginModule required password=x;", "needs"),
        ("", "is not a JAAS login line"),
    ],
)
def test_logins_librdkafka_cannot_take_are_refused_with_what_to_set(
    jaas: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        translate({"sasl.jaas.config": jaas})
    assert SECRET not in str(caught.value)


def test_a_jaas_login_that_disagrees_with_sasl_username_is_refused() -> None:
    with pytest.raises(ConfigError, match="disagree"):
        translate({"sasl.jaas.config": PLAIN.format(SECRET), "sasl.username": "other"})
    with pytest.raises(ConfigError, match="set it to PLAIN"):
        translate({"sasl.jaas.config": PLAIN.format(SECRET), "sasl.mechanism": "SCRAM-SHA-256"})


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The local stack's CA (PEM), its broker's PKCS#12 keystore and its truststore as
    Java's keytool writes it (PKCS#12, and JKS too), all under the password
    :data:`SECRET`."""
    from eos_connectors.dev.stack.kafka import _make_stores, keytool

    if shutil.which("keytool") is None:
        pytest.skip("keytool (a JDK) is not installed")
    where = tmp_path_factory.mktemp("stores")
    _make_stores(where, SECRET)
    keytool(
        where,
        SECRET,
        "-importcert",
        "-noprompt",
        "-alias",
        "ca",
        "-file",
        "ca.pem",
        "-keystore",
        "truststore.jks",
        store_type="JKS",
    )
    return where


@pytest.mark.cost(4)
def test_a_pkcs12_truststore_becomes_the_ca_pem(stores: Path) -> None:
    out = translate(
        {
            "ssl.truststore.location": str(stores / "truststore.p12"),
            "ssl.truststore.password": SECRET,
            "ssl.truststore.type": "PKCS12",
        }
    )
    assert out == {"ssl.ca.pem": (stores / "ca.pem").read_text().replace("\r", "")}
    # the store's type left unsaid (Java's default is JKS): read from the file itself
    unsaid = translate(
        {
            "ssl.truststore.location": str(stores / "truststore.p12"),
            "ssl.truststore.password": SECRET,
        }
    )
    assert unsaid == out
    pem = translate(
        {"ssl.truststore.location": str(stores / "ca.pem"), "ssl.truststore.type": "PEM"}
    )
    assert pem == {"ssl.ca.location": str(stores / "ca.pem")}


def test_a_wrong_password_or_a_jks_store_is_a_clear_error_without_the_password(
    stores: Path,
) -> None:
    with pytest.raises(ConfigError, match="does not open as PKCS#12") as caught:
        translate(
            {
                "ssl.truststore.location": str(stores / "truststore.p12"),
                "ssl.truststore.password": "no",
            }
        )
    jks = str(stores / "truststore.jks")
    with pytest.raises(ConfigError, match="a JKS store") as converted:
        translate({"ssl.truststore.location": jks, "ssl.truststore.password": SECRET})
    assert f"keytool -importkeystore -srckeystore {jks} -srcstoretype JKS" in str(converted.value)
    with pytest.raises(ConfigError, match="cannot read"):
        translate({"ssl.truststore.location": str(stores / "missing.p12")})
    for error in (caught.value, converted.value):
        assert SECRET not in str(error)


def test_a_pkcs12_keystore_goes_to_librdkafka_as_it_is(stores: Path) -> None:
    keystore = {
        "ssl.keystore.location": str(stores / "broker.p12"),
        "ssl.keystore.password": SECRET,
    }
    out = translate({**keystore, "ssl.keystore.type": "PKCS12", "ssl.key.password": SECRET})
    assert out == keystore
    with pytest.raises(ConfigError, match="one password") as caught:
        translate({**keystore, "ssl.key.password": "other"})
    assert SECRET not in str(caught.value)


def test_java_settings_reach_the_sources_and_sinks_clients(stores: Path) -> None:
    options = parse_options(
        {
            "kafka.bootstrap.servers": "h:9093",
            "subscribe": "t",
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": SCRAM.format(SECRET),
            "kafka.ssl.truststore.location": str(stores / "truststore.p12"),
            "kafka.ssl.truststore.password": SECRET,
            "kafka.ssl.endpoint.identification.algorithm": "",
        }
    )
    config = options.client_config()
    assert config["sasl.username"] == "app" and config["sasl.password"] == SECRET
    assert config["ssl.ca.pem"].startswith("-----BEGIN CERTIFICATE-----")
    assert config["ssl.endpoint.identification.algorithm"] == "none"
    assert not any(key.startswith(("ssl.truststore", "sasl.jaas")) for key in config)
    assert SECRET not in repr(options)


OAUTH_JAAS = (
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required "
    'clientId="cid" clientSecret="{}" scope="kafka" extension_logicalCluster="lkc-1" '
    'extension_identityPoolId="pool-2";'
)
OIDC_HANDLER = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler"


def test_a_java_jobs_oidc_login_becomes_librdkafkas() -> None:
    """Kafka's OIDC login (KIP-768), as Confluent Cloud's Java settings give it: the
    handler is dropped, the JAAS options become librdkafka's sasl.oauthbearer.*."""
    out = translate(
        {
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.login.callback.handler.class": OIDC_HANDLER,
            "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
            "sasl.jaas.config": OAUTH_JAAS.format(SECRET),
        }
    )
    assert out == {
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "cid",
        "sasl.oauthbearer.client.secret": SECRET,
        "sasl.oauthbearer.scope": "kafka",
        "sasl.oauthbearer.extensions": "logicalCluster=lkc-1,identityPoolId=pool-2",
    }
    unsecured = translate(
        {
            "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer."
            'OAuthBearerLoginModule required unsecuredLoginStringClaim_sub="alice";'
        }
    )
    assert unsecured["sasl.oauthbearer.config"] == "principal=alice"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"sasl.login.callback.handler.class": "com.example.Mine"}, "loads no Java classes"),
        ({"sasl.login.callback.handler.class": OIDC_HANDLER}, "token.endpoint.url"),
        (
            {
                "sasl.login.callback.handler.class": OIDC_HANDLER,
                "sasl.oauthbearer.token.endpoint.url": "https://idp/token",
                "sasl.oauthbearer.client.secret": "other",
            },
            "disagree",
        ),
        ({"sasl.mechanism": "PLAIN"}, "set it to OAUTHBEARER"),
    ],
)
def test_a_java_oauth_login_that_cannot_be_taken_is_refused(
    settings: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        translate({**settings, "sasl.jaas.config": OAUTH_JAAS.format(SECRET)})
    assert SECRET not in str(caught.value)
