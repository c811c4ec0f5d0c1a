"""Spark's jars off a Python worker's import path (task process, Spark's Python workers).

Spark starts every Python worker with its core jar on ``PYTHONPATH``
(``PythonUtils.sparkPythonPath`` adds the jar of its own class; Spark 4.0's core jar
holds ~5,300 entries and no Python module), and PySpark calls
:func:`importlib.invalidate_caches` at the start of every task
(``worker_util.setup_spark_files``) and of every planning call of a Python data source.
On Python 3.11 and 3.12 that call makes each zip importer read its archive's whole
directory again, in Python (CPython gh-103200, lazy from 3.13 on): the jar is read once
for itself and once for each namespace package that has a folder in it (``google``),
~50-120 ms of CPU a task. That was 40% of the Python processes' CPU in a conformance
run (py-spy), paid by every task of every query.

:func:`drop_spark_jars` takes such jars off ``sys.path`` and out of
``sys.path_importer_cache``: a jar without a Python module can import nothing, so
nothing else changes. The worker daemon calls it before it forks (every task worker
of a session that uses it), and the package does on import inside a Spark Python
worker (a planning process, or a task worker of ``pyspark.daemon``), so a reused
process pays the read once. Nothing is done on Python 3.13+, nor outside a worker.
"""

from __future__ import annotations

import os
import sys
import zipimport
from pathlib import Path

#: What zipimport imports from an archive.
_MODULE_SUFFIXES = (".py", ".pyc")


def drop_spark_jars() -> list[str]:
    """Take every ``.jar`` on ``sys.path`` that holds no Python module off it, with its
    importers; the entries dropped (task process or Spark's Python worker)."""
    if sys.version_info >= (3, 13):  # invalidating a zip importer is cheap there
        return []
    dropped = [entry for entry in sys.path if _jar_without_python(entry)]
    if dropped:
        sys.path[:] = [entry for entry in sys.path if entry not in dropped]
        for key in list(sys.path_importer_cache):
            if any(key == jar or key.startswith(jar + os.sep) for jar in dropped):
                del sys.path_importer_cache[key]
    return dropped


def in_spark_worker() -> bool:
    """Whether this process is one of Spark's Python workers past its set-up (PySpark
    sets ``SparkFiles._is_running_on_worker`` there); never imports PySpark."""
    files = sys.modules.get("pyspark.files")
    spark_files = getattr(files, "SparkFiles", None)
    return bool(getattr(spark_files, "_is_running_on_worker", False))


def _jar_without_python(entry: str) -> bool:
    if not entry.lower().endswith(".jar") or not Path(entry).is_file():
        return False
    importer = sys.path_importer_cache.get(entry)
    if not isinstance(importer, zipimport.zipimporter):
        try:
            importer = zipimport.zipimporter(entry)
        except zipimport.ZipImportError:
            return False
    names = getattr(importer, "_files", None)  # the archive's directory, 3.11-3.12
    if not isinstance(names, dict):
        return False
    return not any(name.endswith(_MODULE_SUFFIXES) for name in names)
