"""A SparkSession set up for this package's tools, pipelines, demos and tests.

``local_session()`` gives a ``local[N]`` session (or one on ``master``) with the
package's data sources registered; ``tool_session()`` the one an operator tool
runs in. Starting one costs a fresh JVM about 12 s on a 2-core machine, most of
it loading and verifying Spark's classes; with a class-data-sharing archive of
those classes (built once per machine into the package's cache by the
development tooling, :mod:`eos_connectors.dev.warm_up`) it takes about 6 s. A
session maps the archive when it is there and starts without it otherwise.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from eos_connectors.ops.cache import cache_root
from eos_connectors.ops.spark_home import installed_spark_home, linked_spark_home, starting_spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


# local[N,F]: let a task fail F-1 times (a killed Python worker) before the query fails.
TASK_ATTEMPTS = 4
#: On a cluster: attempts of a stage in a row (fetch failures after lost executors).
STAGE_ATTEMPTS = 8

#: ``file:`` checkpoints (local, or a shared mount) through Hadoop's raw local file
#: system: no ``.crc`` checksum file beside every checkpoint file. Without Hadoop's
#: native library (the pip PySpark has none) each local file operation that sets a
#: permission or resolves a link forks ``chmod`` or ``readlink`` from the JVM, and the
#: checksum file doubles them: one atomic checkpoint write through Spark's FileContext
#: manager (``offsets/N``, ``commits/N``, the state store's files; a batch writes about
#: six) took 28-34 ms, and 19-23 ms raw (200 writes, local[1]). Only FileContext's
#: class changes (``fs.AbstractFileSystem.file.impl``, what Spark's checkpoint manager
#: uses): ``fs.file.impl`` too broke executors on a cluster, where Spark casts the
#: ``file:`` FileSystem to LocalFileSystem. Renames stay atomic (rename(2)); other
#: schemes (hdfs, s3a) are not touched; a session's own ``conf`` can set it back.
LOCAL_FILES_RAW: dict[str, str] = {
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs",
}

#: Settings every session of this package gets (loopback only, RocksDB state with
#: changelog checkpointing, no speculation, Arrow transfers, reused Python workers
#: forked from a daemon that imported the task modules first, Unix domain sockets
#: between Spark and its Python processes).
BASE_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.speculation": "false",
    "spark.python.worker.reuse": "true",
    # Tasks hand over to their Python workers, and the streaming source's driver-side
    # runner answers Spark, over Unix domain sockets instead of loopback TCP: with the
    # workers' garbage collection cut (eos_connectors.worker_daemon.freeze), a local[2] job
    # of four Python data source write tasks went from 133 to 59 ms (median of 25).
    # PySpark 4.1+; 4.0 ignores the setting (TCP on loopback).
    "spark.python.unix.domain.socket.enabled": "true",
    # Workers fork with pyarrow, pandas, confluent-kafka and the connectors imported.
    "spark.python.daemon.module": "eos_connectors.worker_daemon",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.stateStore.providerClass": (
        "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
    ),
    "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
    **LOCAL_FILES_RAW,
}

#: Settings that change the driver JVM's own class path: a session with one of them
#: cannot use the class archive (the JVM would ignore it anyway, since the paths
#: differ). ``spark.jars`` does not: Spark loads those jars with a class loader of its
#: own, and the archive still serves Spark's classes (13,000 of them, counted with
#: -Xlog:class+load for Spark's Kafka connector jars).
_CLASS_PATH_CONF = ("spark.driver.extraClassPath",)


def local_session(
    app: str = "eos",
    cores: int = 2,
    conf: Mapping[str, str] | None = None,
    master: str | None = None,
) -> SparkSession:
    """A session with the package's data sources registered.

    ``master`` defaults to ``local[cores, 4]`` (a task may fail three times, as a
    killed Python worker makes it); give ``spark://host:port`` for a standalone
    cluster, ``sc://host:port`` for a Spark Connect server, or ``connect`` for a
    Spark Connect session on a local Connect server this process starts (local mode
    behind it). ``conf`` adds or overrides Spark settings.
    """
    from eos_connectors.registry import register

    master = master or f"local[{cores},{TASK_ATTEMPTS}]"
    settings = {
        **BASE_CONF,
        "spark.driver.memory": os.environ.get("EOS_SPARK_DRIVER_MEMORY", "2g"),
        "spark.log.level": os.environ.get("EOS_SPARK_LOG_LEVEL", "WARN"),
        **cluster_conf(master),
        **(conf or {}),
    }
    if is_connect(master):
        spark = _start_connect(app, master, cores, settings)
    else:
        spark = start_classic(app, master, with_class_archive(settings))
    register(spark)
    return spark


CONNECT_LOCAL = "connect"


def is_connect(master: str | None) -> bool:
    """Whether ``master`` asks for a Spark Connect session (see :func:`local_session`)."""
    return master is not None and (master == CONNECT_LOCAL or master.startswith("sc://"))


def _start_connect(app: str, master: str, cores: int, settings: Mapping[str, str]) -> SparkSession:
    """A Spark Connect session: to the server at ``sc://...`` (only ``spark.sql.*``
    settings apply to a session there), or to a local Connect server started here."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master == CONNECT_LOCAL:
        # The local server takes its settings from here when it starts; set on the
        # session afterwards, the static ones would only warn that they cannot change.
        remote = f"local[{cores},{TASK_ATTEMPTS}]"
        os.environ["PYSPARK_REMOTE_INIT_CONF_LEN"] = "1"
        os.environ["PYSPARK_REMOTE_INIT_CONF_0"] = json.dumps(dict(settings))
    else:
        remote = master
    builder = SparkSession.builder.remote(remote).appName(app)
    for key, value in settings.items():
        if key.startswith("spark.sql."):  # a session can set these on any server
            builder = builder.config(key, value)
    with starting_spark():
        return builder.getOrCreate()


#: Environment variables a driver passes on to its executors on a cluster, where they do
#: not inherit the driver's environment: the fault settings of the tests and the harness
#: (never a secret), and the Python path the driver's own modules came from.
FORWARDED_ENV_PREFIXES = ("EOS_FAULT_",)
FORWARDED_ENV = ("PYTHONPATH",)


def cluster_conf(master: str) -> dict[str, str]:
    """Settings for a session on a cluster (``master`` not ``local``): one-core executors
    that retry a failed task three times, stages resubmitted up to :data:`STAGE_ATTEMPTS`
    times in a row, and :data:`FORWARDED_ENV` as ``spark.executorEnv.*``."""
    if master.startswith("local") or is_connect(master):
        return {}
    forwarded = {
        name: value
        for name, value in os.environ.items()
        if name in FORWARDED_ENV or name.startswith(FORWARDED_ENV_PREFIXES)
    }
    return {
        **_executor_class_archive(master),
        "spark.executor.cores": "1",
        "spark.executor.memory": os.environ.get("EOS_SPARK_EXECUTOR_MEMORY", "1g"),
        "spark.task.maxFailures": str(TASK_ATTEMPTS),
        # A lost executor takes its shuffle files along, and every stage reading them
        # fails and is resubmitted; Spark gives a query up after 4 such attempts of one
        # stage in a row (a CI run lost 4 executors in 17 s to three queries' faults).
        "spark.stage.maxConsecutiveAttempts": str(STAGE_ATTEMPTS),
        **{f"spark.executorEnv.{name}": value for name, value in forwarded.items()},
    }


def start_classic(app: str, master: str, settings: Mapping[str, str]) -> SparkSession:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # listen on loopback only
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in settings.items():
        builder = builder.config(key, value)
    with starting_spark():
        spark = builder.getOrCreate()
    _lift_shell_threshold(spark, settings.get("spark.log.level", "WARN"))
    return spark


_QUIETER_THAN_WARN = frozenset({"WARN", "ERROR", "FATAL", "OFF"})


def _lift_shell_threshold(spark: SparkSession, level: str) -> None:
    """Let ``spark.log.level`` below WARN through (driver).

    A PySpark driver JVM starts as a shell, whose console appender drops every line
    below WARN unless the logger is configured by name, whatever the root level says;
    ``EOS_SPARK_LOG_LEVEL=INFO`` would print nothing new without this.
    """
    if level.upper() in _QUIETER_THAN_WARN:
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    logging = getattr(getattr(jvm.org.apache.spark.internal, "Logging$"), "MODULE$")
    getattr(logging, "sparkShellThresholdLevel_$eq")(None)


# -- the class-data-sharing archive ------------------------------------------------------

QUIET_CDS = "-Xlog:cds=off -Xlog:cds+dynamic=off"


def class_archive_path() -> Path:
    """The archive for this PySpark, its SPARK_HOME and this ``java``: another JDK, Spark
    or home (the archive records the jars' paths) gets its own."""
    import pyspark

    java = shutil.which("java") or "java"
    stat = Path(java).resolve().stat() if shutil.which("java") else None
    home = linked_spark_home() or os.environ.get("SPARK_HOME") or installed_spark_home()
    key = f"{pyspark.__version__}|{Path(java).resolve()}|{stat.st_mtime_ns if stat else 0}|{home}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return cache_root() / "spark-cds" / f"pyspark-{pyspark.__version__}-{digest}.jsa"


def _archive_option() -> str | None:
    """The JVM option that maps the archive, when one is built and wanted
    (``EOS_SPARK_CLASS_ARCHIVE`` is not ``0``)."""
    archive = class_archive_path()
    if os.environ.get("EOS_SPARK_CLASS_ARCHIVE", "1") == "0" or not archive.exists():
        return None
    return f"-XX:SharedArchiveFile={archive} {QUIET_CDS}"


def with_class_archive(settings: dict[str, str]) -> dict[str, str]:
    """``settings`` plus the driver JVM option that maps the archive, when one is built,
    wanted and the class path is Spark's own."""
    option = _archive_option()
    if option is None or any(k in settings for k in _CLASS_PATH_CONF):
        return settings
    return with_java_option(settings, option)


def _executor_class_archive(master: str) -> dict[str, str]:
    """On a standalone cluster on this machine (``spark://127.0.0.1:...``, as ``eos stack
    up --spark-workers`` runs one), executors map the driver's archive too: they load
    Spark's classes from the same jars, and each lost executor's replacement starts
    sooner. Elsewhere the archive is not on the executors' hosts: nothing is set."""
    host = master.removeprefix("spark://").rsplit(":", 1)[0]
    option = _archive_option()
    if host not in ("127.0.0.1", "localhost") or option is None:
        return {}
    return {"spark.executor.extraJavaOptions": option}


def with_java_option(settings: dict[str, str], option: str) -> dict[str, str]:
    key = "spark.driver.extraJavaOptions"
    current = settings.get(key, "")
    return {**settings, key: f"{current} {option}".strip()}


@contextlib.contextmanager
def tool_session(app: str) -> Iterator[SparkSession]:
    """A session for a tool (``eos state get``, ``eos checkpoint rescale``): the active one
    (a notebook's, a test's), else a local one, stopped afterwards."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        yield active
        return
    spark = local_session(app=app)
    try:
        yield spark
    finally:
        spark.stop()


#: Spark's state checkpoint format setting: the query's, not kept in its checkpoint.
STATE_FORMAT = "spark.sql.streaming.stateStore.checkpointFormatVersion"


@contextlib.contextmanager
def using_state_format(spark: SparkSession, version: int) -> Iterator[None]:
    """Driver: ``spark`` set to a checkpoint's state format (``Checkpoint.state_format``)
    while a tool reads or rewrites its state, the session's own setting back afterwards.
    Spark's state reader looks for format 1's file names otherwise (FileNotFound on
    ``1.changelog``), and its rewriter refuses. Format 2 is readable from PySpark 4.1."""
    from eos_connectors.core.spark_api import SPARK_MINOR, release
    from eos_connectors.ops.locations import CheckpointError

    if version >= 2 and SPARK_MINOR < (4, 1):
        raise CheckpointError(
            f"This checkpoint's state is in Spark's checkpoint format {version} ({STATE_FORMAT}"
            f"={version}), which Spark's state reader reads from PySpark 4.1; PySpark "
            f"{release()} cannot. Run the command from a PySpark 4.1+ environment."
        )
    before = spark.conf.get(STATE_FORMAT, None)
    spark.conf.set(STATE_FORMAT, str(version))
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(STATE_FORMAT)
        else:
            spark.conf.set(STATE_FORMAT, before)
