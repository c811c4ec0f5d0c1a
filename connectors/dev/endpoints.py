"""Where the three services listen, as the environment and the stack name them."""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from eos_connectors.core.errors import ConfigError
from eos_connectors.core.kafka_config import plaintext
from eos_connectors.core.secrets import redact

ENV_NAMES = ("EOS_KAFKA_BOOTSTRAP", "EOS_POSTGRES_DSN", "EOS_REDIS_URL")
SASL_ENV_NAMES = ("EOS_KAFKA_SASL_BOOTSTRAP", "EOS_KAFKA_SASL_USERNAME", "EOS_KAFKA_SASL_PASSWORD")
#: The SASL_SSL listener (optional): where, and the PKCS#12 truststore of its CA
TLS_ENV_NAMES = (
    "EOS_KAFKA_SASL_SSL_BOOTSTRAP",
    "EOS_KAFKA_TRUSTSTORE",
    "EOS_KAFKA_TRUSTSTORE_PASSWORD",
)
#: The mutual TLS listener (optional): where, and the client's PKCS#12 keystore (its
#: password is the truststore's)
MTLS_ENV_NAMES = ("EOS_KAFKA_MTLS_BOOTSTRAP", "EOS_KAFKA_CLIENT_KEYSTORE")
#: The OAUTHBEARER listener (optional), whose broker takes unsecured tokens (``alg``
#: none) whose subject is the SASL user
OAUTH_ENV_NAME = "EOS_KAFKA_OAUTH_BOOTSTRAP"
SASL_MECHANISM = "SCRAM-SHA-512"
#: The brokers' listeners for network faults: "proxy=listener,..." per broker, the
#: address the broker advertises there (where a fault proxy listens) and the one it binds
PROXIED_ENV_NAME = "EOS_KAFKA_PROXIED"


@dataclass(frozen=True)
class KafkaSasl:
    """A SASL_PLAINTEXT listener of the same broker, and the user to sign in as; and,
    where the broker has one, its SASL_SSL listener with the PKCS#12 truststore that
    holds the CA of its certificate."""

    bootstrap: str
    username: str
    password: str = field(repr=False)
    ssl_bootstrap: str = ""
    truststore: str = ""
    truststore_password: str = field(default="", repr=False)
    mechanism: str = SASL_MECHANISM
    #: the broker's mutual TLS listener, where it has one, and the client keystore (a
    #: certificate the same CA signed) that signs in there
    mtls_bootstrap: str = ""
    client_keystore: str = ""
    #: the broker's OAUTHBEARER listener (SASL_PLAINTEXT), where it has one
    oauth_bootstrap: str = ""

    def options(self) -> dict[str, str]:
        """The ``kafka.*`` options of a source or sink (Spark's pass-through names)."""
        return {f"kafka.{k}": v for k, v in self.client_config().items()}

    def client_config(self) -> dict[str, str]:
        """librdkafka's settings for this listener."""
        return {
            "bootstrap.servers": self.bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": self.mechanism,
            "sasl.username": self.username,
            "sasl.password": self.password,
        }

    def java_options(self) -> dict[str, str]:
        """The SASL_SSL listener as a Java job's ``kafka.*`` options name it: a JAAS login
        and a PKCS#12 truststore (empty when the broker has no such listener)."""
        if not self.ssl_bootstrap:
            return {}
        login = (
            "org.apache.kafka.common.security.scram.ScramLoginModule required "
            f'username="{self.username}" password="{self.password}";'
        )
        return {
            "kafka.bootstrap.servers": self.ssl_bootstrap,
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": self.mechanism,
            "kafka.sasl.jaas.config": login,
            "kafka.ssl.truststore.location": self.truststore,
            "kafka.ssl.truststore.password": self.truststore_password,
            "kafka.ssl.truststore.type": "PKCS12",
        }

    def mtls_options(self) -> dict[str, str]:
        """The mutual TLS listener as a Java job's ``kafka.*`` options name it: a PKCS#12
        keystore and truststore (empty when the broker has no such listener)."""
        if not self.mtls_bootstrap:
            return {}
        stores = {
            f"kafka.ssl.{kind}.{part}": value
            for kind, location in (
                ("keystore", self.client_keystore),
                ("truststore", self.truststore),
            )
            for part, value in (
                ("location", location),
                ("password", self.truststore_password),
                ("type", "PKCS12"),
            )
        }
        return {
            "kafka.bootstrap.servers": self.mtls_bootstrap,
            "kafka.security.protocol": "SSL",
            **stores,
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KafkaSasl | None:
        bootstrap, username, password = (env.get(n, "") for n in SASL_ENV_NAMES)
        if not (bootstrap and username and password):
            return None
        ssl_bootstrap, truststore, truststore_password = (env.get(n, "") for n in TLS_ENV_NAMES)
        mtls_bootstrap, client_keystore = (env.get(n, "") for n in MTLS_ENV_NAMES)
        return cls(
            bootstrap,
            username,
            password,
            ssl_bootstrap=ssl_bootstrap,
            truststore=truststore,
            truststore_password=truststore_password,
            mtls_bootstrap=mtls_bootstrap,
            client_keystore=client_keystore,
            oauth_bootstrap=env.get(OAUTH_ENV_NAME, ""),
        )

    def as_env(self) -> dict[str, str]:
        values = (self.bootstrap, self.username, self.password)
        tls = (self.ssl_bootstrap, self.truststore, self.truststore_password)
        mtls = (self.mtls_bootstrap, self.client_keystore)
        return {
            **dict(zip(SASL_ENV_NAMES, values, strict=True)),
            **(dict(zip(TLS_ENV_NAMES, tls, strict=True)) if self.ssl_bootstrap else {}),
            **(dict(zip(MTLS_ENV_NAMES, mtls, strict=True)) if self.mtls_bootstrap else {}),
            **({OAUTH_ENV_NAME: self.oauth_bootstrap} if self.oauth_bootstrap else {}),
        }


@dataclass(frozen=True)
class Endpoints:
    kafka_bootstrap: str
    postgres_dsn: str
    redis_url: str
    kafka_sasl: KafkaSasl | None = None  # the broker's SASL listener, where there is one
    #: per broker, (address it advertises, address it binds) of a listener meant to be
    #: reached through a fault proxy listening at the first (`eos verify --network-fault
    #: kafka:...`); empty for brokers started without one
    kafka_proxied: tuple[tuple[str, str], ...] = ()

    @property
    def kafka(self) -> dict[str, str]:
        """librdkafka's settings for the plaintext listener."""
        return plaintext(self.kafka_bootstrap)

    def __repr__(self) -> str:  # the DSN's and URL's passwords never reach a log line
        return (
            f"Endpoints(kafka_bootstrap={self.kafka_bootstrap!r}, "
            f"postgres_dsn={redact(self.postgres_dsn)!r}, redis_url={redact(self.redis_url)!r}, "
            f"kafka_sasl={self.kafka_sasl!r})"
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Endpoints | None:
        """Endpoints named by the environment: None when none is set, an error when some are."""
        env = os.environ if env is None else env
        values = [env.get(name, "") for name in ENV_NAMES]
        if not any(values):
            return None
        missing = [name for name, value in zip(ENV_NAMES, values, strict=True) if not value]
        if missing:
            raise ConfigError(
                f"{', '.join(missing)} not set while the other service variables are: "
                "set all three (see `eos stack env`) or none."
            )
        kafka, postgres, redis = values
        proxied = tuple(
            (proxy, bound)
            for pair in env.get(PROXIED_ENV_NAME, "").split(",")
            if pair
            for proxy, _, bound in [pair.partition("=")]
        )
        return cls(kafka, postgres, redis, KafkaSasl.from_env(env), proxied)

    def as_env(self) -> dict[str, str]:
        values = (self.kafka_bootstrap, self.postgres_dsn, self.redis_url)
        sasl = self.kafka_sasl.as_env() if self.kafka_sasl else {}
        proxied = ",".join(f"{proxy}={bound}" for proxy, bound in self.kafka_proxied)
        return {
            **dict(zip(ENV_NAMES, values, strict=True)),
            **sasl,
            **({PROXIED_ENV_NAME: proxied} if proxied else {}),
        }

    def exports(self) -> str:
        return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in self.as_env().items())

    def describe(self) -> str:
        """A human summary that never shows a password."""
        return (
            f"Kafka      {self.kafka_bootstrap}\n"
            f"PostgreSQL {redact(self.postgres_dsn)}\n"
            f"Redis      {redact(self.redis_url)}\n"
            + (
                f"Kafka SASL {self.kafka_sasl.bootstrap} ({self.kafka_sasl.mechanism}, "
                f"user {self.kafka_sasl.username})\n"
                if self.kafka_sasl
                else ""
            )
        )
