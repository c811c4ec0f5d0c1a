"""Driver: a SPARK_HOME from which Spark's Python processes import PySpark compiled.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on the path
of every Python process it starts. The zip holds PySpark's sources only, and Python
keeps no byte code for modules it imports from a zip, so each of those processes
compiles the PySpark modules it imports, every time: ``import pyspark.daemon`` takes
1.2 s of CPU from the zip against 0.3 s from the installed package (measured on the
2-core machine of ``docs/bench``). A streaming query with a Python source and sink
starts eight of them one after the other before its first batch commits (data
source look-up, creation, the source's runner, read planning, write planning, the
task workers' daemon and its workers, the sink's commit runner), and a restart
starts them all again, so this was most of what a recovery took beyond the JVM
connector's.

With PySpark installed by pip, ``SPARK_HOME`` is the package's own directory and the
zip holds the very modules installed next to it. :func:`linked_spark_home` builds,
once per PySpark in the package's cache, a directory linking every entry of that
home except ``python/lib``; sessions of this package start their JVM (and the
standalone cluster of ``eos stack`` its master and workers) with it as
``SPARK_HOME``. Spark's scripts, jars and configuration are the same files; Python
finds no zip and imports the installed PySpark and py4j, with their cached byte code,
as the driver does.

It does not apply (and Spark starts as it would anyway) when ``SPARK_HOME`` names
another Spark, when the Python workers are another interpreter than the driver's
(``PYSPARK_PYTHON``), when py4j is not installed as a package, or when
``EOS_SPARK_LINKED_HOME=0``.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from eos_connectors.ops.cache import cache_root

#: ``0`` starts Spark with the installed SPARK_HOME, its zips included.
SWITCH = "EOS_SPARK_LINKED_HOME"


def installed_spark_home() -> Path:
    """The pip-installed PySpark's directory, which is its SPARK_HOME."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def linked_spark_home() -> Path | None:
    """The linked home for the installed PySpark, built on first use; None when it does
    not apply (see the module's documentation) or could not be built."""
    import pyspark

    installed = installed_spark_home()
    digest = hashlib.sha256(str(installed).encode()).hexdigest()[:12]
    home = cache_root() / "spark-home" / f"pyspark-{pyspark.__version__}-{digest}"
    if not _applies(installed, home):
        return None
    if home.is_dir():
        return home
    try:
        _build(installed, home)
    except OSError as exc:
        print(
            f"eos: could not link a SPARK_HOME at {home} ({exc}); Spark starts from {installed}",
            file=sys.stderr,
        )
        return None
    return home


def _applies(installed: Path, home: Path) -> bool:
    if os.environ.get(SWITCH) == "0":
        return False
    configured = os.environ.get("SPARK_HOME")
    if configured and Path(configured).resolve() not in (installed, home.resolve()):
        return False  # another Spark
    if not (installed / "python" / "lib" / "pyspark.zip").is_file():
        return False  # not the pip layout
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    if Path(shutil.which(python) or python).absolute() != Path(sys.executable).absolute():
        return False  # the workers' Python may not have PySpark installed
    py4j = importlib.util.find_spec("py4j")
    return py4j is not None and py4j.origin is not None and ".zip" not in py4j.origin


def _build(installed: Path, home: Path) -> None:
    """Link ``installed``'s entries into ``home``, all but ``python/lib``; built aside
    and renamed into place, so concurrent drivers never see a partial home."""
    home.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=home.parent, prefix=f".{home.name}-"))
    partial.chmod(0o755)  # mkdtemp makes it private
    try:
        (partial / "python").mkdir()
        for entry in installed.iterdir():
            if entry.name != "python":
                (partial / entry.name).symlink_to(entry)
        for entry in (installed / "python").iterdir():
            if entry.name != "lib":
                (partial / "python" / entry.name).symlink_to(entry)
        try:
            partial.rename(home)
        except OSError:
            if not home.is_dir():  # not a concurrent driver's rename: a real failure
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)


@contextlib.contextmanager
def starting_spark() -> Iterator[None]:
    """Driver: ``SPARK_HOME`` set to the linked home (when it applies) while a JVM
    starts, then restored; PySpark starts the JVM with this process's environment."""
    home = linked_spark_home()
    if home is None:
        yield
        return
    before = os.environ.get("SPARK_HOME")
    os.environ["SPARK_HOME"] = str(home)
    try:
        yield
    finally:
        if before is None:
            del os.environ["SPARK_HOME"]
        else:
            os.environ["SPARK_HOME"] = before


if __name__ == "__main__":
    # `python -m eos_connectors.ops.spark_home`: the linked home's path, to start a cluster's
    # master and workers with as SPARK_HOME (empty when it does not apply).
    print(linked_spark_home() or "")
