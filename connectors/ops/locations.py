"""Where checkpoints and savepoints live: a local path, or any file system Spark reaches.

A location without a scheme (or ``file:``) is a :class:`pathlib.Path`. Any other
(``hdfs:``, ``s3a:``, ``abfs:``, ``gs:`` ...) is a :class:`HadoopPath`: the part of
pathlib's interface the tools use, carried out by Hadoop's ``FileSystem`` API in a
JVM, the running SparkContext's when there is one (a notebook's, a tool's), else
one started for the tool (about 3 s). So the tools read and write a checkpoint with
the same file system classes and the same settings (``spark.hadoop.*`` in
``spark-defaults.conf``, ``HADOOP_CONF_DIR``) as the query that wrote it, on any
store it can run on, with no client library of their own.

Files are copied where a hard link is impossible (every non-local file system, or
across devices); :func:`copy_file` says which it did. A copy from one Hadoop store
to another, or to and from local files, runs inside the JVM: no bytes pass through
Python. Driver-side tooling.
"""

from __future__ import annotations

import errno
import fnmatch
import os
import shutil
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Union
from urllib.parse import urlparse

from eos_connectors.core.errors import EosError, keeping_code


class CheckpointError(EosError):
    """A location that is not a readable streaming checkpoint (or savepoint), one in the
    wrong state, or one its file system refused."""


#: A checkpoint's or a savepoint's location.
Location = Union[Path, "HadoopPath"]


def location(text: str) -> Location:
    """The location a ``checkpointLocation``-style string names."""
    parsed = urlparse(text)
    if parsed.scheme in ("", "file") or len(parsed.scheme) == 1:  # a: is a Windows drive
        return Path(parsed.path if parsed.scheme == "file" else text)
    return HadoopPath(text.rstrip("/") or text)


def is_local(where: Location) -> bool:
    return isinstance(where, Path)


@dataclass(frozen=True)
class Entry:
    """A file under a directory: its path relative to it, its location and size."""

    relative: str
    where: Location
    size: int


def children(directory: Location, pattern: str = "*") -> list[Location]:
    """The entries of ``directory`` whose names match ``pattern``, sorted by name."""
    found: list[Location] = list(directory.glob(pattern))
    return sorted(found, key=str)


def walk_files(directory: Location) -> Iterator[Entry]:
    """Every file under ``directory`` (recursively), in no particular order."""
    if isinstance(directory, HadoopPath):
        yield from directory.walk_files()
        return
    for top, _dirs, names in os.walk(directory):
        here = Path(top)
        for name in names:
            path = here / name
            yield Entry(path.relative_to(directory).as_posix(), path, path.stat().st_size)


def copy_file(source: Location, target: Location) -> bool:
    """Copy ``source`` to ``target`` (its parent made); a hard link when both are local
    on one file system (True), else a copy (False)."""
    if isinstance(source, Path) and isinstance(target, Path):
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
        shutil.copy2(source, target)
        return False
    _hadoop().copy(_uri(source), _uri(target))
    return False


def rename(source: Location, target: Location) -> None:
    """Rename ``source`` to ``target`` on its file system (atomic on local disks and HDFS)."""
    if isinstance(source, HadoopPath) and isinstance(target, HadoopPath):
        source.rename(target)
        return
    if isinstance(source, Path) and isinstance(target, Path):
        source.rename(target)
        return
    raise CheckpointError(f"Cannot rename {source} to {target}: another file system.")


#: Copies to or from a Hadoop store in flight at once: each is a few round trips to
#: the NameNode and a DataNode (about 50 ms on the loopback HDFS), so a savepoint of a
#: few hundred small state files is bound by latency, not bandwidth.
PARALLEL_COPIES = 8


def copy_files(pairs: list[tuple[Location, Location]]) -> bool:
    """:func:`copy_file` for each ``(source, target)``, in parallel when a Hadoop store
    is involved; True when every one was a hard link."""
    if all(isinstance(s, Path) and isinstance(t, Path) for s, t in pairs):
        return all([copy_file(s, t) for s, t in pairs])
    with ThreadPoolExecutor(PARALLEL_COPIES, thread_name_prefix="eos-copy") as pool:
        return all(list(pool.map(lambda pair: copy_file(*pair), pairs)))


def remove_tree(where: Location) -> None:
    """Delete ``where`` and everything under it; nothing when it does not exist."""
    if isinstance(where, HadoopPath):
        where.remove_tree()
    else:
        shutil.rmtree(where, ignore_errors=True)


def _uri(where: Location) -> str:
    return str(where) if isinstance(where, HadoopPath) else where.resolve().as_uri()


@dataclass(frozen=True)
class Stat:
    """What :meth:`HadoopPath.stat` tells (the fields of ``os.stat_result`` it has)."""

    st_size: int
    st_mtime: float  # seconds since the epoch


class HadoopPath:
    """A path on a Hadoop file system, with the pathlib methods the tools use."""

    def __init__(self, uri: str) -> None:
        parsed = urlparse(uri)
        self._root = f"{parsed.scheme}://{parsed.netloc}"
        self._path = PurePosixPath(parsed.path or "/")

    def __str__(self) -> str:
        return f"{self._root}{self._path}"

    def __repr__(self) -> str:
        return f"HadoopPath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HadoopPath) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: HadoopPath) -> bool:
        return str(self) < str(other)

    def __truediv__(self, name: str | PurePosixPath) -> HadoopPath:
        return HadoopPath(f"{self._root}{self._path / name}")

    @property
    def name(self) -> str:
        return self._path.name

    @property
    def parent(self) -> HadoopPath:
        return HadoopPath(f"{self._root}{self._path.parent}")

    def with_name(self, name: str) -> HadoopPath:
        return HadoopPath(f"{self._root}{self._path.with_name(name)}")

    def relative_to(self, other: HadoopPath) -> PurePosixPath:
        return self._path.relative_to(other._path)

    def resolve(self) -> HadoopPath:
        """The fully qualified form the file system itself prints (the way Spark names it)."""
        return HadoopPath(_hadoop().qualified(str(self)))

    def exists(self) -> bool:
        return _hadoop().status(str(self)) is not None

    def is_file(self) -> bool:
        status = _hadoop().status(str(self))
        return status is not None and bool(status.isFile())

    def is_dir(self) -> bool:
        status = _hadoop().status(str(self))
        return status is not None and bool(status.isDirectory())

    def iterdir(self) -> Iterator[HadoopPath]:
        for status in _hadoop().listing(str(self)):
            yield self / str(status.getPath().getName())

    def glob(self, pattern: str) -> Iterator[HadoopPath]:
        """Children matching ``pattern``, one ``/``-separated level at a time."""
        found = [self]
        for part in pattern.split("/"):
            found = [
                c for d in found if d.is_dir() for c in d.iterdir() if fnmatch.fnmatch(c.name, part)
            ]
        yield from sorted(found, key=str)

    def walk_files(self) -> Iterator[Entry]:
        for relative, size in _hadoop().files(str(self)):
            yield Entry(relative, self / relative, size)

    def stat(self) -> Stat:
        status = _hadoop().status(str(self))
        if status is None:
            raise CheckpointError(f"{self} does not exist.")
        return Stat(int(status.getLen()), int(status.getModificationTime()) / 1000)

    def read_text(self) -> str:
        return _hadoop().read(str(self)).decode()

    def write_text(self, text: str) -> None:
        _hadoop().write(str(self), text.encode())

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        if self.exists() and not exist_ok:
            raise CheckpointError(f"{self} exists already.")
        _hadoop().mkdirs(str(self))

    def rename(self, target: HadoopPath) -> HadoopPath:
        _hadoop().rename(str(self), str(target))
        return target

    def unlink(self, missing_ok: bool = False) -> None:
        if not _hadoop().delete(str(self), recursive=False) and not missing_ok:
            raise CheckpointError(f"{self} does not exist.")

    def remove_tree(self) -> None:
        _hadoop().delete(str(self), recursive=True)


def _matches(path: HadoopPath, pattern: str) -> bool:
    return fnmatch.fnmatchcase(path.name, pattern)


class _Hadoop:
    """Hadoop's FileSystem API through py4j, with the configuration Spark would use."""

    def __init__(self, jvm: Any, conf: Any) -> None:
        self.jvm = jvm
        self.conf = conf

    def _path(self, uri: str) -> Any:
        return self.jvm.org.apache.hadoop.fs.Path(uri)

    def _fs(self, path: Any) -> Any:
        return path.getFileSystem(self.conf)

    def _call(self, what: str, uri: str, call: Any) -> Any:
        try:
            return call()
        except Exception as exc:  # py4j's Java exception: keep its first line only
            raise keeping_code(
                CheckpointError(f"Could not {what} {uri}: {_first_line(exc)}"), exc
            ) from None

    def qualified(self, uri: str) -> str:
        path = self._path(uri)
        return str(self._call("resolve", uri, lambda: self._fs(path).makeQualified(path)))

    def status(self, uri: str) -> Any:
        path = self._path(uri)

        def look() -> Any:
            try:  # one round trip to the NameNode, not exists() and then the status
                return self._fs(path).getFileStatus(path)
            except Exception as exc:
                if "java.io.FileNotFoundException" in _first_line(exc):
                    return None
                raise

        return self._call("look at", uri, look)

    def listing(self, uri: str) -> list[Any]:
        path = self._path(uri)
        return list(self._call("list", uri, lambda: self._fs(path).listStatus(path)))

    def files(self, uri: str) -> list[tuple[str, int]]:
        """(path relative to ``uri``, size) of every file under it."""
        path = self._path(uri)

        def walk() -> list[tuple[str, int]]:
            fs = self._fs(path)
            base = str(fs.makeQualified(path).toUri().getPath()).rstrip("/") + "/"
            found = []
            listing = fs.listFiles(path, True)
            while listing.hasNext():
                status = listing.next()
                name = str(status.getPath().toUri().getPath())
                found.append((name.removeprefix(base), int(status.getLen())))
            return found

        found: list[tuple[str, int]] = self._call("list", uri, walk) if self.status(uri) else []
        return found

    def read(self, uri: str) -> bytes:
        path = self._path(uri)

        def read() -> bytes:
            stream = self._fs(path).open(path)
            try:
                data: bytes = self.jvm.org.apache.commons.io.IOUtils.toByteArray(stream)
                return data
            finally:
                stream.close()

        return self._call("read", uri, read)  # type: ignore[no-any-return]

    def write(self, uri: str, data: bytes) -> None:
        path = self._path(uri)

        def write() -> None:
            stream = self._fs(path).create(path, True)
            try:
                stream.write(bytearray(data))
            finally:
                stream.close()

        self._call("write", uri, write)

    def mkdirs(self, uri: str) -> None:
        path = self._path(uri)
        self._call("create the directory", uri, lambda: self._fs(path).mkdirs(path))

    def rename(self, source: str, target: str) -> None:
        src, dst = self._path(source), self._path(target)
        if not self._call("rename", source, lambda: self._fs(src).rename(src, dst)):
            raise CheckpointError(
                f"Could not rename {source} to {target} (it exists, or no parent)."
            )

    def delete(self, uri: str, recursive: bool) -> bool:
        path = self._path(uri)
        return bool(self._call("delete", uri, lambda: self._fs(path).delete(path, recursive)))

    def copy(self, source: str, target: str) -> None:
        src, dst = self._path(source), self._path(target)

        def copy() -> bool:
            util = self.jvm.org.apache.hadoop.fs.FileUtil
            return bool(util.copy(self._fs(src), src, self._fs(dst), dst, False, True, self.conf))

        if not self._call("copy", source, copy):
            raise CheckpointError(f"Could not copy {source} to {target}.")


def _first_line(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


_launched: list[_Hadoop] = []
_lock = threading.Lock()


def _hadoop() -> _Hadoop:
    """The running (classic) SparkContext's JVM, from any thread; else a JVM of this
    process's own, started once."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    if context is not None and context._jvm is not None:
        return _Hadoop(context._jvm, context._jsc.hadoopConfiguration())
    with _lock:
        if not _launched:
            _launched.append(_launch())
        return _launched[0]


def _launch() -> _Hadoop:
    """A JVM with Spark's jars and its configuration (``spark-defaults.conf``) but no
    SparkContext: Hadoop's configuration as a session would build it."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    gateway = launch_gateway(SparkConf().set("spark.ui.enabled", "false"))  # type: ignore[no-untyped-call]
    jvm = gateway.jvm
    spark_conf = jvm.org.apache.spark.SparkConf(True)
    conf = jvm.org.apache.spark.deploy.SparkHadoopUtil.get().newConfiguration(spark_conf)
    return _Hadoop(jvm, conf)
