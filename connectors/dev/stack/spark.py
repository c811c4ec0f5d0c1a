"""A Spark standalone cluster on loopback, from the pip pyspark: one master, N workers.

The pip package ships ``bin/spark-class`` but no ``sbin/start-master.sh``, so each
process is started directly: ``spark-class org.apache.spark.deploy.master.Master``
and ``...deploy.worker.Worker <master URL>``. Each worker offers one core, so a
two-worker cluster runs an application on two executors in two JVMs, and killing
one executor loses the tasks and shuffle files it held, as on a real cluster.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path

from eos_connectors.dev.stack.process import LOOPBACK, free_port, pid_alive, spawn, wait_until
from eos_connectors.dev.stack.service import Service, ServiceRecord
from eos_connectors.ops.spark_home import installed_spark_home, linked_spark_home

WORKER_CORES = 1
WORKER_MEMORY = "2g"
START_TIMEOUT = 120.0


def spark_home() -> Path:
    """The installed PySpark's home, linked so that Python workers import PySpark
    compiled (:mod:`eos_connectors.ops.spark_home`) when that applies."""
    return linked_spark_home() or installed_spark_home()


def _spark_class(main: str, *args: str) -> list[str]:
    return [str(spark_home() / "bin" / "spark-class"), main, *args]


def cluster_environment() -> dict[str, str]:
    """What the master, the workers and so every executor start with: loopback only, and
    this Python (with the package installed) for the executors' Python workers; the
    working directory importable there too (a test's or a connector author's modules)."""
    paths = [str(Path.cwd()), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_HOME": str(spark_home()),
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": os.pathsep.join(p for p in paths if p),
    }


def _master_state(web_port: int) -> dict[str, object] | None:
    """The master's JSON status page, or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{LOOPBACK}:{web_port}/json/", timeout=2) as page:
            state: dict[str, object] = json.load(page)
            return state
    except (OSError, ValueError):
        return None


class SparkMaster(Service):
    """The standalone master: ``spark://127.0.0.1:<port>``; its web UI's port second."""

    name = "spark-master"

    @property
    def marker(self) -> Path:
        return self.dir / "master.conf"

    def check_installed(self) -> None:
        spark_home()  # pyspark is a dependency of the package; java is checked by Spark

    def start(self, previous: ServiceRecord | None) -> ServiceRecord:
        port = free_port(previous.ports[0] if previous else None)
        web = free_port(previous.ports[1] if previous else None)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.marker.write_text("spark.master.rest.enabled false\n")
        argv = _spark_class(
            "org.apache.spark.deploy.master.Master",
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--webui-port",
            str(web),
            "--properties-file",
            str(self.marker),
        )
        pid = spawn(argv, self.log_path, self.dir, cluster_environment())
        record = ServiceRecord(self.name, pid, (port, web), f"spark://{LOOPBACK}:{port}")
        wait_until(
            lambda: self.answers(record),
            START_TIMEOUT,
            f"Spark master on port {port}",
            alive=lambda: pid_alive(pid),
            log_path=self.log_path,
        )
        return record

    def answers(self, record: ServiceRecord) -> bool:
        state = _master_state(record.ports[1])
        return state is not None and state.get("status") == "ALIVE"

    def alive_workers(self, record: ServiceRecord) -> list[str]:
        """``host:port`` of each worker the master sees alive."""
        state = _master_state(record.ports[1]) or {}
        workers = state.get("workers", [])
        assert isinstance(workers, list)
        return [f"{w['host']}:{w['port']}" for w in workers if w.get("state") == "ALIVE"]


class SparkWorker(Service):
    """Worker ``index`` of the cluster, registered with the master it is given."""

    def __init__(self, root: Path, index: int, master: SparkMaster) -> None:
        self.name = f"spark-worker-{index}"  # type: ignore[misc]
        super().__init__(root)
        self.master = master

    @property
    def marker(self) -> Path:
        return self.dir / "work"

    def check_installed(self) -> None:
        spark_home()

    def start(self, previous: ServiceRecord | None) -> ServiceRecord:
        master = self.master.running()
        if master is None:
            raise RuntimeError("start the Spark master first")
        port = free_port(previous.ports[0] if previous else None)
        web = free_port(previous.ports[1] if previous else None)
        self.marker.mkdir(parents=True, exist_ok=True)
        argv = _spark_class(
            "org.apache.spark.deploy.worker.Worker",
            master.endpoint,
            "--host",
            LOOPBACK,
            "--port",
            str(port),
            "--webui-port",
            str(web),
            "--cores",
            str(WORKER_CORES),
            "--memory",
            WORKER_MEMORY,
            "--work-dir",
            str(self.marker),
        )
        pid = spawn(argv, self.log_path, self.dir, cluster_environment())
        return ServiceRecord(self.name, pid, (port, web), f"{LOOPBACK}:{port}")

    def wait_registered(self, record: ServiceRecord) -> None:
        wait_until(
            lambda: self.answers(record),
            START_TIMEOUT,
            f"Spark {self.name}",
            alive=lambda: pid_alive(record.pid),
            log_path=self.log_path,
        )

    def answers(self, record: ServiceRecord) -> bool:
        master = self.master.running()
        return master is not None and record.endpoint in self.master.alive_workers(master)
