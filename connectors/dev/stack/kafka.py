"""Apache Kafka in KRaft combined mode, run with ``java`` from the broker's Maven Central jars."""

from __future__ import annotations

import base64
import json
import os
import secrets
import shutil
import subprocess
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from eos_connectors.core.errors import StackError
from eos_connectors.dev.endpoints import SASL_MECHANISM, KafkaSasl
from eos_connectors.dev.stack.process import (
    LOOPBACK,
    free_port,
    pid_alive,
    require_binary,
    run,
    spawn,
    wait_until,
)
from eos_connectors.dev.stack.service import Service, ServiceRecord
from eos_connectors.ops.cache import cache_root

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.rsa import RSAPrivateKey
    from cryptography.x509 import Certificate

KAFKA_VERSION = "4.3.1"
SCALA_VERSION = "2.13"
LOG4J_VERSION = "2.24.3"
SLF4J_VERSION = "2.0.17"

SASL_USER = "eos"
#: The common name of the client certificate the mutual TLS listener's user signs in with.
CLIENT_NAME = "eos-client"
#: KRaft's authorizer: ACLs live in the metadata log.
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SCRAM_ITERATIONS = 4096

# Broker settings shared with docker-compose.yml (a test checks that they match).
KAFKA_SETTINGS: dict[str, str] = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "8",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "8",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "group.initial.rebalance.delay.ms": "0",
    # The coordinator looks for transactions open past their timeout every second (not
    # every 10 s), so a test of a timed-out task transaction waits seconds, not tens.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
    "auto.create.topics.enable": "false",
    "num.partitions": "1",
}

INSTALL_HINT = (
    "Install Java 17+ and Maven (Debian: 'apt-get install -y openjdk-17-jre-headless maven'), "
    "or run 'make bootstrap', which installs them."
)


def maven_pom(artifact: str, *dependencies: tuple[str, str, str]) -> str:
    """A POM whose runtime dependencies are ``(group, artifact, version)`` and log4j2 for
    SLF4J (the broker and Kafka Connect log through it)."""
    logging = (
        ("org.slf4j", "slf4j-api", SLF4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
    )
    listed = "".join(
        f"    <dependency><groupId>{group}</groupId><artifactId>{name}</artifactId>"
        f"<version>{version}</version></dependency>\n"
        for group, name, version in (*dependencies, *logging)
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        f"  <groupId>eos-connectors</groupId><artifactId>{artifact}</artifactId>"
        "<version>1</version>\n"
        f"  <dependencies>\n{listed}  </dependencies>\n</project>\n"
    )


_LOG4J2 = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        Pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Logger:
      - name: kafka
        level: INFO
      - name: org.apache.kafka
        level: WARN
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
"""


def jar_cache_dir() -> Path:
    """Where the broker's jars are resolved once, shared by every stack of this user."""
    return cache_root() / f"kafka_{SCALA_VERSION}-{KAFKA_VERSION}"


def ensure_jars() -> Path:
    """Resolve the broker and its runtime dependencies with Maven (once); return the jar dir."""
    pom = maven_pom("kafka-broker", ("org.apache.kafka", f"kafka_{SCALA_VERSION}", KAFKA_VERSION))
    return maven_jars(jar_cache_dir(), pom, f"Resolving Apache Kafka {KAFKA_VERSION}")


def maven_jars(cache: Path, pom: str, what: str) -> Path:
    """The runtime jars of ``pom``'s dependencies, copied once into ``cache``/libs by Maven
    (again, from scratch, when ``pom`` changed since)."""
    libs = cache / "libs"
    done = cache / ".resolved"
    if done.exists() and done.read_text() == pom:
        return libs
    require_binary("mvn", INSTALL_HINT)
    shutil.rmtree(libs, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "pom.xml").write_text(pom)
    command = ["mvn", "-q", "-B", "dependency:copy-dependencies", "-DincludeScope=runtime"]
    run([*command, f"-DoutputDirectory={libs}"], what=f"{what} from Maven Central", cwd=cache)
    done.write_text(pom)
    return libs


def kafka_answers(bootstrap: str, timeout: float = 2.0) -> bool:
    """True when a broker at ``bootstrap`` answers a metadata request."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        metadata = admin.list_topics(timeout=timeout)
    except Exception:
        return False
    return bool(metadata.brokers)


def add_scram_user(bootstrap: str, user: tuple[str, str]) -> None:
    """Create (or reset) the SASL listener's SCRAM user through the plain listener."""
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    name, password = user
    admin = AdminClient({"bootstrap.servers": bootstrap})
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS)
    upsert = UserScramCredentialUpsertion(name, info, password.encode())
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=60)


@dataclass(frozen=True)
class TlsMaterial:
    """The local broker's TLS: a CA, the broker's key and certificate signed by it (for
    127.0.0.1 and localhost) in ``keystore``, the CA alone in ``truststore`` (what a
    client trusts, and what the mutual TLS listener checks clients by), a client's key
    and certificate signed by it (``CN=eos-client``) in ``client_keystore``, all PKCS#12
    under one generated ``password``."""

    keystore: Path
    truststore: Path
    password: str
    client_keystore: Path


def tls_material(where: Path) -> TlsMaterial:
    """Made once per stack directory (passwords through the environment, never on a
    command line); the same files afterwards."""
    keystore, truststore = where / "broker.p12", where / "truststore.p12"
    secret = where / "password"
    if not truststore.exists():
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        secret.write_text(secrets.token_hex(16))
        secret.chmod(0o600)
        _make_stores(where, secret.read_text())
    return TlsMaterial(keystore, truststore, secret.read_text(), where / "client.p12")


# The CA and the broker's key and certificate are made in this process (the
# cryptography package), the truststore by the JDK's keytool. Java's PKCS#12 reader
# trusts only a certificate that carries its own "trusted" attribute, which keytool
# writes and cryptography cannot; it reads a key entry from either. Eight keytool runs
# (each a JVM) took ~12 core-seconds a stack, one ~0.8; a CI run makes three stacks'.
# The CA's key is not kept: nothing signs with it again.
TLS_DAYS = 3650


def _make_stores(where: Path, password: str) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.serialization import pkcs12

    ca_key, ca = _certificate("eos-connectors local CA", None)
    broker_key, broker = _certificate("127.0.0.1", (ca_key, ca))
    encryption = serialization.BestAvailableEncryption(password.encode())
    store = pkcs12.serialize_key_and_certificates(b"broker", broker_key, broker, [ca], encryption)
    (where / "broker.p12").write_bytes(store)
    client_key, client = _certificate(CLIENT_NAME, (ca_key, ca))
    store = pkcs12.serialize_key_and_certificates(b"client", client_key, client, [ca], encryption)
    (where / "client.p12").write_bytes(store)
    (where / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    keytool(where, password, *_import("ca", "ca.pem", "truststore.p12"))


def _certificate(
    common_name: str, issuer: tuple[RSAPrivateKey, Certificate] | None
) -> tuple[RSAPrivateKey, Certificate]:
    """A new RSA key and its certificate: a CA's, self-signed, without ``issuer`` (its
    key and certificate); else a server's for 127.0.0.1 and localhost, signed by it."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    signer, issuer_name = (key, name) if issuer is None else (issuer[0], issuer[1].subject)
    made = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=TLS_DAYS))
    )
    if issuer is None:
        made = made.add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
    else:
        names = [x509.IPAddress(ipaddress.ip_address(LOOPBACK)), x509.DNSName("localhost")]
        made = made.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return key, made.sign(signer, hashes.SHA256())


def _import(alias: str, certificate: str, store: str) -> tuple[str, ...]:
    return ("-importcert", "-noprompt", "-alias", alias, "-file", certificate, "-keystore", store)


def keytool(where: Path, password: str, *args: str, store_type: str = "PKCS12") -> None:
    """The JDK's keytool in ``where``, the store's password through the environment."""
    argv = [require_binary("keytool", INSTALL_HINT), *args, "-storetype", store_type]
    argv += ["-storepass:env", "EOS_STORE_PASSWORD"]
    env = {**os.environ, "EOS_STORE_PASSWORD": password}
    done = subprocess.run(
        argv, cwd=where, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if done.returncode != 0:
        raise StackError(f"keytool {args[0]} failed: {(done.stdout + done.stderr).strip()}")


#: ``c1``: the brokers compile with C1 alone (:func:`java_command`).
JIT_SETTING = "EOS_KAFKA_JIT"


def java_command(where: Path, heap: str, classpath: str) -> list[str]:
    """``java`` with the broker's jars, logging as ``where/log4j2.yaml`` says (written
    here); the main class and its arguments follow. A broker compiles fully (C2), as in
    production (``make bench`` measures against it), unless ``EOS_KAFKA_JIT=c1`` asks for
    C1 alone: scripts/test.sh does, for the tests' brokers. Measured on the 2-core CI
    machine, one broker: its start took 5.8 core-seconds instead of 10.9, idle 1.6
    instead of 2.0 per 30 s, and the services tier (130 tests) 26.5 core-seconds of the
    broker instead of 47.7, in 138 s instead of 144 s: a test run's brokers never earn
    C2's compiling back. ``JDK_JAVA_OPTIONS`` (the tests' C1 for their own JVMs) comes
    before these flags, so the broker's own setting wins."""
    (where / "log4j2.yaml").write_text(_LOG4J2)
    tier = "1" if os.environ.get(JIT_SETTING, "").strip().lower() == "c1" else "4"
    return [
        require_binary("java", INSTALL_HINT),
        f"-Xmx{heap}",
        "-Xms256m",
        "-XX:+UseG1GC",
        f"-XX:TieredStopAtLevel={tier}",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={where / 'log4j2.yaml'}",
        "-cp",
        classpath,
    ]


def format_storage(
    java: list[str], config: Path, cluster_id: str, where: Path, features: tuple[str, ...] = ()
) -> None:
    """Format a node's log directory for ``cluster_id`` unless it was formatted before.
    ``java``: :func:`java_command`; ``features``: ``name=level`` to finalize (else
    the release's defaults)."""
    data = where / "data"
    if (data / "meta.properties").exists():
        return
    argv = [*java, "kafka.tools.StorageTool", "format", "--cluster-id", cluster_id]
    for feature in features:
        argv += ["--feature", feature]
    try:
        run([*argv, "--config", str(config)], what="Formatting the Kafka storage", cwd=where)
    except StackError as exc:
        raise StackError(f"{exc}\nData directory: {data}") from exc


@dataclass(frozen=True)
class ProxiedListener:
    """A plain listener bound on one port and advertised on another, where a fault
    proxy (the harness's Toxiproxy) listens and forwards to it: a client that
    bootstraps through the proxy is told the proxy's address for every later
    connection too, so all its traffic to the broker crosses the proxy."""

    bound: str
    advertised: str
    security: str = "PROXIED:PLAINTEXT"


def proxied_listener(bound: int, advertised: int) -> ProxiedListener:
    return ProxiedListener(f"PROXIED://{LOOPBACK}:{bound}", f"PROXIED://{LOOPBACK}:{advertised}")


def cluster_id() -> str:
    """A random Kafka cluster id (22 characters of URL-safe base64). Like Kafka's own
    Uuid.randomUuid, never one starting with '-', which the storage tool would take for
    an option (1 id in 64 did: a CI run failed on it)."""
    while True:
        made = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not made.startswith("-"):
            return made


class KafkaService(Service):
    name = "kafka"

    @property
    def marker(self) -> Path:
        return self.dir / "server.properties"

    def check_installed(self) -> None:
        require_binary("java", INSTALL_HINT)
        if not (jar_cache_dir() / ".resolved").exists():
            require_binary("mvn", INSTALL_HINT)

    def start(self, previous: ServiceRecord | None) -> ServiceRecord:
        libs = ensure_jars()
        ports = self._ports(previous.ports if previous else ())
        self._write_config(*ports)
        classpath = f"{libs}/*"
        self._format_storage(classpath)
        pid = spawn(self._java(classpath, "kafka.Kafka", str(self.marker)), self.log_path, self.dir)
        record = ServiceRecord(self.name, pid, ports, f"{LOOPBACK}:{ports[0]}")
        wait_until(
            lambda: self.answers(record),
            timeout=120,
            what=f"Kafka on {record.endpoint}",
            alive=lambda: pid_alive(pid),  # ours: just spawned (its title may be mid-rewrite)
            log_path=self.log_path,
        )
        add_scram_user(record.endpoint, self.sasl_user())
        return record

    @staticmethod
    def _ports(old: tuple[int, ...]) -> tuple[int, ...]:
        """The plain, controller, SASL and SASL_SSL ports, the proxied listener's
        bound and advertised ports (:func:`proxied_listener`), the mutual TLS port and the
        OAUTHBEARER port: the previous ones where still free."""
        chosen: list[int] = []
        for i in range(8):
            port = free_port(old[i] if i < len(old) else None)
            while port in chosen:
                port = free_port()
            chosen.append(port)
        return tuple(chosen)

    def proxied(self, record: ServiceRecord) -> tuple[tuple[str, str], ...]:
        """The broker's proxied listener: (advertised, bound) address (none for a broker
        started before it had one)."""
        if len(record.ports) < 6:
            return ()
        return ((f"{LOOPBACK}:{record.ports[5]}", f"{LOOPBACK}:{record.ports[4]}"),)

    def sasl_user(self) -> tuple[str, str]:
        """The SASL listener's user and its password, made once per stack directory."""
        path = self.dir / "sasl-user.json"
        if not path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                json.dump({"username": SASL_USER, "password": secrets.token_hex(16)}, out)
        user = json.loads(path.read_text())
        return user["username"], user["password"]

    def sasl(self, record: ServiceRecord) -> KafkaSasl | None:
        """The SASL listeners of a running broker (None for one started before it had one;
        no SASL_SSL one for a broker started before it had that)."""
        if len(record.ports) < 3:
            return None
        username, password = self.sasl_user()
        sasl = KafkaSasl(f"{LOOPBACK}:{record.ports[2]}", username, password)
        if len(record.ports) < 4:
            return sasl
        tls = tls_material(self.dir / "tls")
        with_tls = replace(
            sasl,
            ssl_bootstrap=f"{LOOPBACK}:{record.ports[3]}",
            truststore=str(tls.truststore),
            truststore_password=tls.password,
        )
        if len(record.ports) < 7 or not tls.client_keystore.exists():
            return with_tls
        with_mtls = replace(
            with_tls,
            mtls_bootstrap=f"{LOOPBACK}:{record.ports[6]}",
            client_keystore=str(tls.client_keystore),
        )
        if len(record.ports) < 8:
            return with_mtls
        return replace(with_mtls, oauth_bootstrap=f"{LOOPBACK}:{record.ports[7]}")

    def answers(self, record: ServiceRecord) -> bool:
        return kafka_answers(record.endpoint)

    def _java(self, classpath: str, main: str, *args: str) -> list[str]:
        heap = os.environ.get("EOS_KAFKA_HEAP", "1g")
        return [*java_command(self.dir, heap, classpath), main, *args]

    def _write_config(self, *ports: int) -> None:
        port, controller_port, sasl_port, tls_port, bound, advertised, mtls_port, oauth = ports
        self.dir.mkdir(parents=True, exist_ok=True)
        tls = tls_material(self.dir / "tls")
        listeners = (
            f"PLAINTEXT://{LOOPBACK}:{port}",
            f"SASL_PLAINTEXT://{LOOPBACK}:{sasl_port}",
            f"SASL_SSL://{LOOPBACK}:{tls_port}",
            f"SSL://{LOOPBACK}:{mtls_port}",
            f"OAUTH://{LOOPBACK}:{oauth}",
        )
        proxied = proxied_listener(bound, advertised)
        scram = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
        settings = {
            **KAFKA_SETTINGS,
            "controller.quorum.voters": f"1@{LOOPBACK}:{controller_port}",
            "listeners": ",".join(
                (*listeners, proxied.bound, f"CONTROLLER://{LOOPBACK}:{controller_port}")
            ),
            "advertised.listeners": ",".join((*listeners, proxied.advertised)),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,SSL:SSL,"
                f"OAUTH:SASL_PLAINTEXT,{proxied.security},CONTROLLER:PLAINTEXT"
            ),
            "sasl.enabled.mechanisms": SASL_MECHANISM,
            # The broker's side of SCRAM needs a login module; users live in the metadata log.
            f"listener.name.sasl_plaintext.{SASL_MECHANISM.lower()}.sasl.jaas.config": scram,
            f"listener.name.sasl_ssl.{SASL_MECHANISM.lower()}.sasl.jaas.config": scram,
            "listener.name.sasl_ssl.ssl.keystore.location": str(tls.keystore),
            "listener.name.sasl_ssl.ssl.keystore.password": tls.password,
            "listener.name.sasl_ssl.ssl.keystore.type": "PKCS12",
            # OAUTHBEARER with the broker's default validator, which takes unsecured tokens
            # (alg none; production brokers check signed ones against their IdP's keys):
            # a token whose subject is the SASL user signs in as that (super) user
            "listener.name.oauth.sasl.enabled.mechanisms": "OAUTHBEARER",
            "listener.name.oauth.oauthbearer.sasl.jaas.config": (
                "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"
            ),
            # mutual TLS: a client signs in with a certificate the stack's CA signed
            **{
                f"listener.name.ssl.ssl.{k}": v
                for k, v in {
                    "keystore.location": str(tls.keystore),
                    "keystore.password": tls.password,
                    "keystore.type": "PKCS12",
                    "truststore.location": str(tls.truststore),
                    "truststore.password": tls.password,
                    "truststore.type": "PKCS12",
                    "client.auth": "required",
                }.items()
            },
            # ACLs are checked, as in production: the plain listeners' principal (the
            # tests' and the controller's) and the SASL user may do anything; a test
            # user made with tests.kafka_acl_util holds only the ACLs the docs list.
            "authorizer.class.name": AUTHORIZER,
            "super.users": f"User:ANONYMOUS;User:{SASL_USER};User:CN={CLIENT_NAME}",
            "log.dirs": str(self.dir / "data"),
        }
        fd = os.open(self.marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:  # it holds the keystore's password
            out.write("".join(f"{k}={v}\n" for k, v in settings.items()))

    def _format_storage(self, classpath: str) -> None:
        heap = os.environ.get("EOS_KAFKA_HEAP", "1g")
        format_storage(java_command(self.dir, heap, classpath), self.marker, cluster_id(), self.dir)
