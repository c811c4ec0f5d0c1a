"""``eos bench tasks``: what Spark spends handing a task to a Python worker and back.

A Python data source costs a micro-batch a fixed amount per task on top of what a
JVM task costs, paid by every small batch (latency). This measures it directly: the
median time of a ``local[2]`` job of four tasks that do next to nothing, as a JVM
task (the ``noop`` sink), as a Python data source writer and as a Python data
source reader, under three worker set-ups, each in its own Spark session:

* PySpark's defaults (``pyspark.daemon``, loopback TCP), and the same over Unix
  domain sockets;
* this package's daemon, which imports the task modules and freezes them out of
  the garbage collector before it forks (``eos_connectors.worker_daemon``);
* the same over Unix domain sockets: this package's sessions (``BASE_CONF``).

Run as ``eos bench tasks``; ``python -m eos_connectors.dev.compare.task_cost <set-up>``
measures one set-up and prints JSON (the command runs one per set-up).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)

TASKS = 4
JOBS = 25

SETUPS: dict[str, dict[str, str]] = {
    "PySpark defaults": {
        "spark.python.daemon.module": "pyspark.daemon",
        "spark.python.unix.domain.socket.enabled": "false",
    },
    "PySpark's daemon, Unix sockets": {"spark.python.daemon.module": "pyspark.daemon"},
    "imports frozen": {"spark.python.unix.domain.socket.enabled": "false"},
    "imports frozen, Unix sockets (this package)": {},
}


class _Slice(InputPartition):
    def __init__(self, index: int) -> None:
        self.index = index


class _Reader(DataSourceReader):
    def partitions(self) -> list[InputPartition]:
        return [_Slice(i) for i in range(TASKS)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _Slice)
        yield pa.RecordBatch.from_arrays([pa.array([partition.index], pa.int64())], names=["id"])


class _Writer(DataSourceWriter):
    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        for _ in iterator:
            pass
        return WriterCommitMessage()


class TaskProbe(DataSource):
    """Four tasks that read one row each, or write what they get and report nothing."""

    @classmethod
    def name(cls) -> str:
        return "eos_task_probe"

    def schema(self) -> str:
        return "id long"

    def reader(self, schema: Any) -> DataSourceReader:
        return _Reader()

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        return _Writer()


def _median_ms(job: Callable[[], object]) -> float:
    for _ in range(3):  # workers started, modules imported
        job()
    times = []
    for _ in range(JOBS):
        began = time.perf_counter()
        job()
        times.append((time.perf_counter() - began) * 1000)
    return statistics.median(times)


def measure(setup: str) -> dict[str, float]:
    """The median job time of each kind of task under ``setup`` (see :data:`SETUPS`)."""
    from eos_connectors.ops.session import local_session

    spark = local_session("eos-bench-tasks", cores=2, conf=SETUPS[setup])
    try:
        spark.dataSource.register(TaskProbe)
        rows = spark.range(0, TASKS, 1, TASKS)
        return {
            "JVM write": _median_ms(lambda: rows.write.format("noop").mode("overwrite").save()),
            "Python write": _median_ms(
                lambda: rows.write.format("eos_task_probe").mode("append").save()
            ),
            "Python read": _median_ms(lambda: spark.read.format("eos_task_probe").load().count()),
        }
    finally:
        spark.stop()


def run() -> int:
    """Every set-up in its own process (a session's worker settings are fixed at start)."""
    print(f"Median ms of {JOBS} local[2] jobs of {TASKS} tasks each, per worker set-up:")
    print("| worker set-up | JVM write | Python write | Python read |")
    print("|---|--:|--:|--:|")
    for setup in SETUPS:
        out = subprocess.run(
            [sys.executable, "-m", "eos_connectors.dev.compare.task_cost", setup],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        found = json.loads(out.strip().splitlines()[-1])
        cells = " | ".join(f"{found[k]:,.0f}" for k in ("JVM write", "Python write", "Python read"))
        print(f"| {setup} | {cells} |", flush=True)
    return 0


if __name__ == "__main__":
    print(json.dumps(measure(sys.argv[1])))
