"""Spark's jar off a Python worker's import path (connectors/core/worker_path.py): a jar
without Python goes, with its importers, so ``importlib.invalidate_caches`` (PySpark's,
at every task) no longer reads its directory; a jar with a module stays importable.
The Spark side (a task and a planning process without the jar) is
tests/spark/test_worker_daemon.py's. Cost: <1 s."""

from __future__ import annotations

import importlib
import sys
import types
import zipfile
import zipimport
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from eos_connectors.core import worker_path
from eos_connectors.core.worker_path import drop_spark_jars, in_spark_worker

pytestmark = pytest.mark.skipif(
    sys.version_info >= (3, 13), reason="3.13 invalidates a zip importer lazily: nothing to drop"
)


def _jar(path: Path, names: dict[str, str]) -> str:
    with zipfile.ZipFile(path, "w") as jar:
        for name, text in names.items():
            jar.writestr(name, text)
    return str(path)


@pytest.fixture
def jars(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, str]]:
    """A Spark-like jar (classes, and a ``google/`` folder) and a jar with a module, first
    on the path, each with its importers made by an import that searched them."""
    classes = {f"org/apache/spark/C{i}.class": "" for i in range(2000)}
    spark_jar = _jar(tmp_path / "spark-core_2.13-4.0.5.jar", {**classes, "google/p/A.class": ""})
    python_jar = _jar(tmp_path / "tools.jar", {"eos_mod_in_jar.py": "VALUE = 7\n"})
    monkeypatch.setattr(sys, "path", [spark_jar, python_jar, *sys.path])
    importlib.import_module("eos_mod_in_jar")
    yield spark_jar, python_jar
    sys.modules.pop("eos_mod_in_jar", None)
    for key in [k for k in sys.path_importer_cache if k.startswith(str(tmp_path))]:
        del sys.path_importer_cache[key]


def _directory_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count zipimport's reads of an archive's directory, by archive."""
    reads: Counter[str] = Counter()
    read = zipimport._read_directory  # type: ignore[attr-defined]

    def counting(archive: str) -> object:
        reads[archive] += 1
        return read(archive)

    monkeypatch.setattr(zipimport, "_read_directory", counting)
    return reads


def test_a_jar_without_python_leaves_the_path_and_is_read_no_more(
    jars: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    spark_jar, python_jar = jars
    reads = _directory_reads(monkeypatch)
    importlib.invalidate_caches()
    assert reads[spark_jar] >= 1, "the invalidation this saves did not happen"

    assert drop_spark_jars() == [spark_jar]
    assert spark_jar not in sys.path and python_jar in sys.path
    assert not [k for k in sys.path_importer_cache if k.startswith(spark_jar)]
    reads.clear()
    importlib.invalidate_caches()
    assert reads[spark_jar] == 0 and reads[python_jar] == 1
    assert importlib.import_module("eos_mod_in_jar").VALUE == 7
    assert drop_spark_jars() == []


def test_only_a_set_up_spark_worker_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "pyspark.files", raising=False)
    assert not in_spark_worker()
    files = types.ModuleType("pyspark.files")
    spark_files = type("SparkFiles", (), {"_is_running_on_worker": False})
    files.SparkFiles = spark_files  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyspark.files", files)
    assert not in_spark_worker()
    spark_files._is_running_on_worker = True  # type: ignore[attr-defined]
    assert in_spark_worker()


def test_an_entry_that_is_no_readable_jar_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = tmp_path / "broken.jar"
    broken.write_bytes(b"not a zip")
    missing = str(tmp_path / "missing.jar")
    monkeypatch.setattr(sys, "path", [str(broken), missing, *sys.path])
    assert drop_spark_jars() == []
    assert sys.path[:2] == [str(broken), missing]
    assert worker_path._jar_without_python(str(tmp_path)) is False
