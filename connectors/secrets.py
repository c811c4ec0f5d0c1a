"""Keep credentials out of log lines and error messages."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_KV_PASSWORD = re.compile(r"(password\s*=\s*)('[^']*'|\S+)", re.IGNORECASE)


def redact_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***``.

    Works for URL-style DSNs (``postgresql://u:p@h/db``, ``redis://:p@h:6379/0``)
    and libpq key/value DSNs (``host=h password=p``).
    """
    if "://" not in url:
        return _KV_PASSWORD.sub(r"\1***", url)
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{user}:***@{host}{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
