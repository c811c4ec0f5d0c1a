"""Keep credentials out of every repr, error message, log line and command line.

:func:`redact` is the package's one redaction function. It knows every form a
credential takes in this package's inputs:

- URL userinfo, single or multi-host: ``postgresql://u:p@h1:5432,h2:5432/db``,
  ``redis://:p@h:6379/0``;
- URL query and libpq key=value, quoted or not: ``?password=p``,
  ``password='p q\\' r'``;
- option names that hold secrets, in ``k=v``, ``k: v``, dict reprs and JSON:
  ``kafka.sasl.password``, ``kafka.ssl.key.password``, ``sasl.jaas.config``
  (whose own ``password="p"`` is caught too), tokens and client secrets;
- and any value the caller knows is secret (``secrets=``), wherever it appears,
  for messages that quote a fragment out of its context.

Over-redacting a log line costs nothing; one leaked password costs everything,
so the patterns err on the side of hiding.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

MASK = "***"

# What makes an option name or DSN key a secret.
_SENSITIVE_WORDS = (
    "password|passwd|pwd|secret|token|credential|jaas\\.config|ssl\\.key\\.pem|keystore\\.key"
    "|private\\.key"
)
_SENSITIVE_NAME = rf"[\w.-]*(?:{_SENSITIVE_WORDS})[\w.-]*"
_QUOTED = r"'(?:[^'\\]|\\.)*'?|\"(?:[^\"\\]|\\.)*\"?"
_BARE = r"[^\s&#]+"
_NAMED = re.compile(
    rf"(?P<name>{_SENSITIVE_NAME})(?P<close>['\"]?)(?P<sep>\s*[=:]\s*)(?P<value>{_QUOTED}|{_BARE})",
    re.IGNORECASE,
)
# scheme://user:password@host...: the password runs to the last "@" before the path.
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:@/\s?#]*:)(?P<password>[^/\s?#]*)@")


def settings_digest(settings: Mapping[str, object] | str) -> str:
    """A key for client settings that may hold credentials (a pooled client's, say):
    equal settings give equal keys, and the key never shows a password."""
    text = settings if isinstance(settings, str) else repr(sorted(settings.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def is_secret_option(name: str) -> bool:
    """True for an option (or DSN key, or client setting) whose value is a credential."""
    return re.fullmatch(_SENSITIVE_NAME, name, re.IGNORECASE) is not None


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every credential replaced by ``***`` (see the module's list)."""
    for secret in sorted({s for s in secrets if len(s) >= 3}, key=len, reverse=True):
        text = text.replace(secret, MASK)
    text = _USERINFO.sub(rf"\g<head>{MASK}@", text)
    return _NAMED.sub(rf"\g<name>\g<close>\g<sep>{MASK}", text)


def redact_options(options: Mapping[str, str]) -> dict[str, str]:
    """``options`` fit to print: credential options masked, credentials in values redacted."""
    return {
        name: MASK if is_secret_option(name) else redact(value) for name, value in options.items()
    }


def secret_values(options: Mapping[str, object]) -> list[str]:
    """The values of ``options`` that are credentials, to pass as ``redact(secrets=...)``.

    Besides secret-named options, this is the password inside a DSN or URL
    option, so a message quoting it out of context is still redacted.
    """
    texts = {name: value for name, value in options.items() if isinstance(value, str)}
    found = [value for name, value in texts.items() if is_secret_option(name) and value]
    for value in texts.values():
        found.extend(_embedded_passwords(value))
    return found


def _embedded_passwords(value: str) -> list[str]:
    found = [match.group("password") for match in _USERINFO.finditer(value)]
    for match in _NAMED.finditer(value):
        raw = match.group("value")
        found.append(raw.strip("'\"").replace("\\'", "'").replace('\\"', '"'))
    return [v for v in found if v]
