"""Driver: a TLS context for the Kafka sink's transaction client (kafka-python) from
librdkafka's TLS settings, so that the driver connects as the tasks do: the CA (a file
or PEM text), the host name check, and the client's own certificate for mutual TLS, as
files (``ssl.certificate.location``, ``ssl.key.location``), PEM text
(``ssl.certificate.pem``, ``ssl.key.pem``; a Java job's inline PEM keystore becomes
these) or a PKCS#12 keystore (``ssl.keystore.location``, ``ssl.keystore.password``: a
Java job's keystore, taken as it is).

Python's ``ssl`` loads a client certificate and key only from files. PEM text and a
keystore's entries are written to a new private directory (mode 0700), the key
encrypted under a one-time password, loaded, and deleted at once.
"""

from __future__ import annotations

import os
import secrets
import ssl
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eos_connectors.core.errors import ConfigError


def ssl_context(settings: Mapping[str, Any]) -> ssl.SSLContext:
    """The TLS context of ``settings`` (librdkafka's names)."""
    context = ssl.create_default_context(cafile=settings.get("ssl.ca.location"))
    if "ssl.ca.pem" in settings:
        context.load_verify_locations(cadata=str(settings["ssl.ca.pem"]))
    if "ssl.certificate.location" in settings:
        context.load_cert_chain(
            settings["ssl.certificate.location"],
            settings.get("ssl.key.location"),
            settings.get("ssl.key.password"),
        )
    else:
        client = _client_pem(settings)
        if client is not None:
            _load_pem(context, *client)
    if str(settings.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
        context.check_hostname = False
    return context


def _client_pem(settings: Mapping[str, Any]) -> tuple[bytes, Any, str] | None:
    """The client's certificate chain (PEM), private key and the option that gave them,
    from PEM text or a PKCS#12 keystore; None when the settings name neither."""
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        load_pem_private_key,
        pkcs12,
    )

    if "ssl.certificate.pem" in settings:
        password = settings.get("ssl.key.password")
        if "ssl.key.pem" not in settings:
            raise ConfigError("Option 'kafka.ssl.certificate.pem' needs 'kafka.ssl.key.pem'.")
        try:
            key = load_pem_private_key(
                str(settings["ssl.key.pem"]).encode(), password.encode() if password else None
            )
        except (ValueError, TypeError):
            raise ConfigError(
                "Option 'kafka.ssl.key.pem' does not open as a PEM private key with "
                "'kafka.ssl.key.password' (a wrong or missing password, or another format)."
            ) from None
        return str(settings["ssl.certificate.pem"]).encode(), key, "ssl.certificate.pem"
    location = settings.get("ssl.keystore.location")
    if location is None:
        return None
    store_password = settings.get("ssl.keystore.password")
    try:
        store = pkcs12.load_pkcs12(
            Path(location).read_bytes(), store_password.encode() if store_password else None
        )
    except (OSError, ValueError):
        raise ConfigError(
            f"Option 'kafka.ssl.keystore.location': {location} does not open as PKCS#12 with "
            "'kafka.ssl.keystore.password' (a missing file, a wrong or missing password, or "
            "another format)."
        ) from None
    if store.key is None or store.cert is None:
        raise ConfigError(
            f"Option 'kafka.ssl.keystore.location': {location} holds no private key with its "
            "certificate."
        )
    chain = [store.cert.certificate, *(c.certificate for c in store.additional_certs)]
    return b"".join(c.public_bytes(Encoding.PEM) for c in chain), store.key, "ssl.keystore.location"


def _load_pem(context: ssl.SSLContext, chain: bytes, key: Any, named: str) -> None:
    """Load ``chain`` and ``key`` (given by option ``named``) through files that live only
    for the call, the key encrypted under a password made for it."""
    from cryptography.hazmat.primitives.serialization import (
        BestAvailableEncryption,
        Encoding,
        PrivateFormat,
    )

    one_time = secrets.token_hex(16)
    sealed = key.private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(one_time.encode())
    )
    with tempfile.TemporaryDirectory(prefix="eos-tls-") as where:  # made with mode 0700
        chain_file, key_file = Path(where, "chain.pem"), Path(where, "key.pem")
        _write_private(chain_file, chain)
        _write_private(key_file, sealed)
        try:
            context.load_cert_chain(chain_file, key_file, one_time)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"Option 'kafka.{named}': the client certificate and its key do not load "
                f"together ({exc.reason}): give the key of that certificate."
            ) from None


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
