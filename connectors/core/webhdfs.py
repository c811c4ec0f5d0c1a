"""The few HDFS file operations a sink makes on its checkpoint, over WebHDFS's REST API.

A sink's driver-side code runs in a Python process Spark starts, with no JVM to ask
for Hadoop's file system, so it reaches an ``hdfs://`` checkpoint the way any HTTP
client can: the NameNode's WebHDFS endpoint (``dfs.namenode.http-address``). That is
``EOS_WEBHDFS_URL`` when the driver's environment sets it (an HA nameservice, a port
other than Hadoop's default), else ``http://<namenode host>:9870``. Simple
authentication only (``user.name``); a Kerberos-secured NameNode refuses, and the
caller logs that. Standard library only.
"""

from __future__ import annotations

import getpass
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import quote, urlencode, urlparse

from eos_connectors.core.errors import EosError, keeping_code

DEFAULT_HTTP_PORT = 9870
TIMEOUT_SECONDS = 10.0


class WebHdfsError(EosError):
    """The NameNode (or a DataNode) refused or did not answer a WebHDFS call."""


@dataclass(frozen=True)
class WebHdfs:
    """A NameNode's WebHDFS endpoint (``http://host:port``) and the user to act as."""

    base: str
    user: str

    @classmethod
    def for_uri(cls, uri: str) -> WebHdfs:
        """The endpoint serving ``hdfs://namenode[:port]/...``."""
        explicit = os.environ.get("EOS_WEBHDFS_URL")
        base = explicit or f"http://{urlparse(uri).hostname or 'localhost'}:{DEFAULT_HTTP_PORT}"
        return cls(base.rstrip("/"), os.environ.get("HADOOP_USER_NAME") or getpass.getuser())

    def _url(self, path: str, op: str, **params: str) -> str:
        query = urlencode({"op": op, "user.name": self.user, **params})
        return f"{self.base}/webhdfs/v1{quote(path)}?{query}"

    def _call(self, method: str, url: str, data: bytes | None = None) -> bytes:
        if not url.startswith(("http://", "https://")):
            raise WebHdfsError(f"WebHDFS URL {url.split('?')[0]!r}: give an http(s):// URL.")
        request = urllib.request.Request(url, data=data, method=method)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:  # noqa: S310
                body: bytes = answer.read()
                return body
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise keeping_code(
                WebHdfsError(f"WebHDFS {method} {_op(url)}: HTTP {exc.code} {detail}"), exc
            ) from None
        except OSError as exc:
            raise keeping_code(
                WebHdfsError(f"WebHDFS at {self.base} did not answer: {exc}"), exc
            ) from None

    def read_text(self, path: str) -> str | None:
        """The file at ``path``, None when there is none."""
        try:
            return self._call("GET", self._url(path, "OPEN")).decode()
        except WebHdfsError as exc:
            if exc.code == str(HTTPStatus.NOT_FOUND):
                return None
            raise

    def names(self, path: str) -> list[str]:
        """The names in the folder ``path``; [] when there is no such folder."""
        try:
            answer = json.loads(self._call("GET", self._url(path, "LISTSTATUS")))
        except WebHdfsError as exc:
            if exc.code == str(HTTPStatus.NOT_FOUND):
                return []
            raise
        return [str(entry["pathSuffix"]) for entry in answer["FileStatuses"]["FileStatus"]]

    def write_text(self, path: str, text: str) -> None:
        """Create ``path`` (replacing it) with ``text``: the NameNode names a DataNode that
        takes the bytes (WebHDFS's two-step create; ``noredirect`` gives its URL as JSON)."""
        url = self._url(path, "CREATE", overwrite="true", noredirect="true")
        location = json.loads(self._call("PUT", url))["Location"]
        self._call("PUT", location, text.encode())

    def rename(self, source: str, target: str) -> None:
        """Rename ``source`` to ``target`` (replacing it: HDFS renames atomically)."""
        self.delete(target)
        answer = json.loads(self._call("PUT", self._url(source, "RENAME", destination=target)))
        if not answer.get("boolean"):
            raise WebHdfsError(f"WebHDFS could not rename {source} to {target}.")

    def delete(self, path: str) -> None:
        self._call("DELETE", self._url(path, "DELETE", recursive="false"))


def _op(url: str) -> str:
    """The operation and path of a WebHDFS URL, without the query's other parameters."""
    parsed = urlparse(url)
    op = next((p for p in parsed.query.split("&") if p.startswith("op=")), "")
    return f"{parsed.path.removeprefix('/webhdfs/v1')} {op}"
