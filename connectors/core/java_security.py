"""Java client security settings, as a Spark job's ``kafka.*`` options carry them, in
librdkafka's terms.

Spark's Kafka connector hands ``kafka.*`` to the Java client; this package hands them
to librdkafka, which shares the common names (``security.protocol``,
``sasl.mechanism``, ``ssl.keystore.location``) but not these:

* ``sasl.jaas.config`` with the PLAIN or SCRAM login module becomes
  ``sasl.username`` / ``sasl.password``; with the OAuth login module and Kafka's OIDC
  login handler (``sasl.login.callback.handler.class``, dropped) it becomes
  librdkafka's ``sasl.oauthbearer.method=oidc`` with the client id, secret, scope and
  ``extension_*`` options (``sasl.oauthbearer.token.endpoint.url`` has one name in
  both), and without a handler an unsecured token's ``sasl.oauthbearer.config``
  (Kerberos logins are refused, with librdkafka's own settings named);
* a truststore (``ssl.truststore.location``, ``.password``, ``.type``) in PKCS#12
  becomes ``ssl.ca.pem``, its certificates read once on the driver, so executors
  need no copy of the file; a PEM truststore becomes ``ssl.ca.location``;
* a keystore in PKCS#12 is read by librdkafka itself (``ssl.keystore.location`` and
  ``.password``, the same names); ``ssl.keystore.type`` and an
  ``ssl.key.password`` equal to the store's password are dropped;
* ``ssl.endpoint.identification.algorithm`` empty (Java's "off") becomes ``none``.

A JKS or JCEKS store is refused with the ``keytool`` command that converts it to
PKCS#12. No password or JAAS text appears in any error.
"""

from __future__ import annotations

import re
from pathlib import Path

from eos_connectors.core.errors import ConfigError, keeping_code

_PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"
_SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
_OAUTH = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
#: Kafka's OIDC login handler (3.1-3.x named it under ``secured``): the client
#: credentials grant, which librdkafka's ``sasl.oauthbearer.method=oidc`` is.
_OIDC_HANDLERS = {
    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler",
    "org.apache.kafka.common.security.oauthbearer.secured.OAuthBearerLoginCallbackHandler",
}
_REFUSED_LOGINS = {
    "com.sun.security.auth.module.Krb5LoginModule": (
        "set librdkafka's Kerberos settings instead: kafka.sasl.kerberos.service.name, "
        "kafka.sasl.kerberos.principal, kafka.sasl.kerberos.keytab (with a confluent-kafka "
        "built against a librdkafka with Cyrus SASL: the wheels on PyPI have no GSSAPI)"
    ),
}
_JAAS = re.compile(r"^\s*(?P<module>[\w.$]+)\s+(?P<flag>\w+)\s*(?P<options>.*?)\s*;?\s*$", re.S)
_JAAS_OPTION = re.compile(r'(\w+)\s*=\s*("(?:[^"\\]|\\.)*"|[^\s;]+)')
_MAGIC = {b"\xfe\xed\xfe\xed": "JKS", b"\xce\xce\xce\xce": "JCEKS"}
_STORE_TYPES = {"PKCS12", "JKS", "JCEKS", "PEM"}


def translate(settings: dict[str, str]) -> dict[str, str]:
    """Driver: ``settings`` (``kafka.*`` without the prefix) with the Java-only security
    settings replaced by librdkafka's; ConfigError naming the option when one cannot be."""
    out = dict(settings)
    _jaas(out)
    _truststore(out)
    _keystore(out)
    if out.get("ssl.endpoint.identification.algorithm") == "":
        out["ssl.endpoint.identification.algorithm"] = "none"
    return out


def _jaas(out: dict[str, str]) -> None:
    text = out.pop("sasl.jaas.config", None)
    if text is None:
        return
    found = _JAAS.match(text)
    if found is None:
        raise ConfigError(
            "Option 'kafka.sasl.jaas.config' is not a JAAS login line like "
            '<LoginModule class> required username="..." password="...";'
        )
    module = found.group("module")
    if module == _OAUTH:
        options = {k: _unquote(v) for k, v in _JAAS_OPTION.findall(found.group("options"))}
        _oauth(out, options)
        return
    if module in _REFUSED_LOGINS:
        raise ConfigError(
            f"Option 'kafka.sasl.jaas.config' uses {module}, which librdkafka has no JAAS "
            f"for: {_REFUSED_LOGINS[module]}."
        )
    if module not in (_PLAIN, _SCRAM):
        raise ConfigError(
            f"Option 'kafka.sasl.jaas.config': login module {module} is not one librdkafka "
            f"can take; PlainLoginModule and ScramLoginModule are (or set kafka.sasl.username "
            f"and kafka.sasl.password)."
        )
    options = {key: _unquote(value) for key, value in _JAAS_OPTION.findall(found.group("options"))}
    if "username" not in options or "password" not in options:
        raise ConfigError(
            f"Option 'kafka.sasl.jaas.config': {module.rsplit('.', 1)[-1]} needs username= "
            "and password=."
        )
    _mechanism(out, module)
    for key in ("username", "password"):
        given = out.get(f"sasl.{key}")
        if given is not None and given != options[key]:
            raise ConfigError(
                f"Options 'kafka.sasl.jaas.config' and 'kafka.sasl.{key}' disagree; set one."
            )
        out[f"sasl.{key}"] = options[key]


def _oauth(out: dict[str, str], options: dict[str, str]) -> None:
    """The OAuth login module's options as librdkafka's ``sasl.oauthbearer.*``."""
    mechanism = out.setdefault("sasl.mechanism", "OAUTHBEARER").upper()
    if mechanism != "OAUTHBEARER":
        raise ConfigError(
            "Option 'kafka.sasl.jaas.config' logs in with OAuthBearerLoginModule, but "
            f"'kafka.sasl.mechanism' is {mechanism}: set it to OAUTHBEARER."
        )
    handler = out.pop("sasl.login.callback.handler.class", None)
    if handler is None:  # Kafka's default: an unsecured token from the JAAS options
        subject = options.get("unsecuredLoginStringClaim_sub")
        if subject is None:
            raise ConfigError(
                "Option 'kafka.sasl.jaas.config': OAuthBearerLoginModule without "
                "kafka.sasl.login.callback.handler.class signs in with an unsecured token, "
                "which needs unsecuredLoginStringClaim_sub=; for OIDC set the handler "
                "(org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler)."
            )
        life = options.get("unsecuredLoginLifetimeSeconds")
        config = f"principal={subject}" + (f" lifeSeconds={life}" if life else "")
        _agree(out, "sasl.oauthbearer.config", config)
        return
    if handler not in _OIDC_HANDLERS:
        raise ConfigError(
            f"Option 'kafka.sasl.login.callback.handler.class' {handler!r}: librdkafka loads "
            "no Java classes; Kafka's OIDC handler (OAuthBearerLoginCallbackHandler) is "
            "taken, as librdkafka's sasl.oauthbearer.method=oidc."
        )
    if "clientId" not in options or "clientSecret" not in options:
        raise ConfigError(
            "Option 'kafka.sasl.jaas.config': OAuthBearerLoginModule with the OIDC handler "
            "needs clientId= and clientSecret=."
        )
    if "sasl.oauthbearer.token.endpoint.url" not in out:
        raise ConfigError(
            "OAuthBearerLoginModule with the OIDC handler needs "
            "kafka.sasl.oauthbearer.token.endpoint.url (the same name in Java and librdkafka)."
        )
    _agree(out, "sasl.oauthbearer.method", "oidc")
    _agree(out, "sasl.oauthbearer.client.id", options["clientId"])
    _agree(out, "sasl.oauthbearer.client.secret", options["clientSecret"])
    if "scope" in options:
        _agree(out, "sasl.oauthbearer.scope", options["scope"])
    prefix = "extension_"
    extensions = ",".join(
        f"{k.removeprefix(prefix)}={v}" for k, v in options.items() if k.startswith(prefix)
    )
    if extensions:
        _agree(out, "sasl.oauthbearer.extensions", extensions)


def _agree(out: dict[str, str], name: str, value: str) -> None:
    """``out[name]`` set to ``value`` from the JAAS login; ConfigError when the option is
    also given with another value (never showing either)."""
    if out.setdefault(name, value) != value:
        raise ConfigError(f"Options 'kafka.sasl.jaas.config' and 'kafka.{name}' disagree; set one.")


def _mechanism(out: dict[str, str], module: str) -> None:
    mechanism = out.get("sasl.mechanism", "").upper()
    if module == _PLAIN:
        if mechanism not in ("", "PLAIN"):
            raise ConfigError(
                f"Option 'kafka.sasl.jaas.config' logs in with PlainLoginModule, but "
                f"'kafka.sasl.mechanism' is {mechanism}: set it to PLAIN."
            )
        out["sasl.mechanism"] = "PLAIN"
    elif mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise ConfigError(
            "Option 'kafka.sasl.jaas.config' logs in with ScramLoginModule: set "
            "'kafka.sasl.mechanism' to SCRAM-SHA-256 or SCRAM-SHA-512, as the brokers expect."
        )


def _unquote(value: str) -> str:
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return re.sub(r"\\(.)", r"\1", value[1:-1])
    return value


def _truststore(out: dict[str, str]) -> None:
    location = out.pop("ssl.truststore.location", None)
    password = out.pop("ssl.truststore.password", None)
    declared = out.pop("ssl.truststore.type", None)
    certificates = out.pop("ssl.truststore.certificates", None)
    if certificates is not None:  # Java's PEM truststore given inline
        _not_both(out, "ssl.ca.pem", "ssl.truststore.certificates")
        out["ssl.ca.pem"] = certificates
    if location is None:
        return
    _not_both(out, "ssl.ca.location", "ssl.truststore.location")
    _not_both(out, "ssl.ca.pem", "ssl.truststore.location")
    kind = _store_kind(location, declared, "truststore")
    if kind == "PEM":
        out["ssl.ca.location"] = location
        return
    out["ssl.ca.pem"] = _certificates_pem(Path(location), password)


def _keystore(out: dict[str, str]) -> None:
    declared = out.pop("ssl.keystore.type", None)
    location = out.get("ssl.keystore.location")
    chain, key = out.pop("ssl.keystore.certificate.chain", None), out.pop("ssl.keystore.key", None)
    if chain is not None or key is not None:  # Java's PEM keystore given inline
        out["ssl.certificate.pem"], out["ssl.key.pem"] = chain or "", key or ""
    if location is None:
        return
    kind = _store_kind(location, declared, "keystore")
    if kind == "PEM":
        raise ConfigError(
            "Option 'kafka.ssl.keystore.location' names a PEM file: give librdkafka's "
            "kafka.ssl.certificate.location and kafka.ssl.key.location instead."
        )
    key_password = out.get("ssl.key.password")
    if key_password is not None and key_password != out.get("ssl.keystore.password"):
        raise ConfigError(
            "Option 'kafka.ssl.key.password' differs from 'kafka.ssl.keystore.password': "
            "librdkafka opens a PKCS#12 keystore with one password. Re-export the store "
            "with its key under the store's password."
        )
    out.pop("ssl.key.password", None)


def _not_both(out: dict[str, str], mine: str, theirs: str) -> None:
    if mine in out:
        raise ConfigError(f"Options 'kafka.{mine}' and 'kafka.{theirs}' both name the CA; set one.")


def _store_kind(location: str, declared: str | None, what: str) -> str:
    """PKCS12 or PEM, from the file itself (Java's default type, JKS, is often left
    unsaid); ConfigError for JKS and JCEKS with the command that converts them."""
    option = f"kafka.ssl.{what}.location"
    if declared is not None and declared.upper() not in _STORE_TYPES:
        raise ConfigError(
            f"Option 'kafka.ssl.{what}.type' is {declared!r}: PKCS12 or PEM are read here."
        )
    path = Path(location)
    try:
        head = path.read_bytes()[:4]
    except OSError as exc:
        raise keeping_code(
            ConfigError(
                f"Option '{option}': cannot read {location} on the driver ({exc.strerror})."
            ),
            exc,
        ) from None
    java_only = _MAGIC.get(head)
    if java_only is not None:
        converted = path.with_suffix(".p12")
        raise ConfigError(
            f"Option '{option}': {location} is a {java_only} store, which only Java reads. "
            f"Convert it to PKCS#12 once (keytool asks for the passwords) and name the new "
            f"file: keytool -importkeystore -srckeystore {location} -srcstoretype {java_only} "
            f"-destkeystore {converted} -deststoretype PKCS12"
        )
    if head.startswith(b"-----") or (declared or "").upper() == "PEM":
        return "PEM"
    return "PKCS12"


def _certificates_pem(path: Path, password: str | None) -> str:
    """Every certificate of a PKCS#12 truststore, as one PEM text."""
    from cryptography.hazmat.primitives.serialization import Encoding, pkcs12

    try:
        store = pkcs12.load_pkcs12(path.read_bytes(), password.encode() if password else None)
    except ValueError:
        raise ConfigError(
            f"Option 'kafka.ssl.truststore.location': {path} does not open as PKCS#12 with "
            "'kafka.ssl.truststore.password' (a wrong or missing password, or another format)."
        ) from None
    certificates = [c.certificate for c in ([store.cert] if store.cert else [])]
    certificates += [c.certificate for c in store.additional_certs]
    if not certificates:
        raise ConfigError(f"Option 'kafka.ssl.truststore.location': {path} holds no certificate.")
    return "".join(c.public_bytes(Encoding.PEM).decode() for c in certificates)
