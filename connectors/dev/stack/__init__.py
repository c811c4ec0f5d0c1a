"""The local service stack: real Kafka, PostgreSQL and Redis without Docker.

``Stack(root).up()`` starts what is not running (reusing what is) and returns the
endpoints; ``down()`` stops only the processes this stack started. Everything the
stack writes lives under one root directory (``EOS_STACK_DIR``); the Kafka jars
are resolved once into a per-user cache (``EOS_CACHE_DIR``).
"""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from eos_connectors.core.errors import StackError
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.stack.hdfs import HdfsService
from eos_connectors.dev.stack.kafka import KAFKA_SETTINGS, KAFKA_VERSION, KafkaService
from eos_connectors.dev.stack.kafka_cluster import KafkaCluster
from eos_connectors.dev.stack.postgres import POSTGRES_SETTINGS, PostgresService
from eos_connectors.dev.stack.process import LOOPBACK, crash, descendants
from eos_connectors.dev.stack.redis import REDIS_SETTINGS, RedisService
from eos_connectors.dev.stack.service import Service, ServiceRecord
from eos_connectors.dev.stack.spark import SparkMaster, SparkWorker

__all__ = [
    "KAFKA_SETTINGS",
    "KAFKA_VERSION",
    "POSTGRES_SETTINGS",
    "REDIS_SETTINGS",
    "ServiceRecord",
    "ServiceStatus",
    "Stack",
    "default_root",
]


def default_root() -> Path:
    """``EOS_STACK_DIR``, else a per-user directory PostgreSQL's OS user can reach when root."""
    explicit = os.environ.get("EOS_STACK_DIR")
    if explicit:
        return Path(explicit).resolve()
    if os.geteuid() == 0:
        return Path("/var/lib/eos-connectors/stack")
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "eos-connectors" / "stack"


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    running: bool
    pid: int | None
    endpoint: str | None


class Stack:
    """The services under one root. Kafka is one broker (the default) or, after
    ``up(kafka_brokers=3)``, a replicated cluster whose nodes are named ``kafka-<n>``;
    the choice is kept in ``root/kafka-brokers`` until ``down``."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_root()
        self.services: dict[str, Service] = {
            s.name: s
            for s in (KafkaService(self.root), PostgresService(self.root), RedisService(self.root))
        }
        self.master = SparkMaster(self.root)
        self.hdfs = HdfsService(self.root)

    @property
    def kafka_brokers(self) -> int:
        """How many Kafka brokers this stack runs (or last ran): 1 or a cluster's count."""
        chosen = self.root / "kafka-brokers"
        return int(chosen.read_text()) if chosen.exists() else 1

    @property
    def cluster(self) -> KafkaCluster | None:
        """The replicated Kafka, when the stack runs one instead of the single broker."""
        brokers = self.kafka_brokers
        return KafkaCluster(self.root, brokers) if brokers > 1 else None

    def _running_services(self) -> list[Service]:
        """The services ``up`` keeps running: all but the single broker when a cluster
        stands in for it."""
        skip = {"kafka"} if self.cluster is not None else set()
        return [s for name, s in self.services.items() if name not in skip]

    def _choose_brokers(self, brokers: int) -> None:
        """Record how many brokers ``up`` starts; refused while another count runs."""
        if brokers == 2 or brokers < 1:
            raise StackError(
                f"--kafka-brokers {brokers}: choose 1 (one broker) or 3 or more (a replicated "
                "cluster with min.insync.replicas = brokers - 1)."
            )
        current = self.kafka_brokers
        if brokers == current:
            return
        running = self.services["kafka"].running() if current == 1 else None
        cluster = self.cluster
        if running is not None or (cluster is not None and cluster.any_running()):
            raise StackError(
                f"The stack runs {current} Kafka broker(s); stop it first (`eos stack down`) "
                f"to start {brokers}."
            )
        (self.root / "kafka-brokers").write_text(str(brokers))

    def workers(self, count: int) -> list[SparkWorker]:
        return [SparkWorker(self.root, i, self.master) for i in range(1, count + 1)]

    def up_spark(self, workers: int) -> str:
        """Start a standalone Spark master and ``workers`` workers (one core each) on
        loopback, reusing running ones; return the master URL once every worker has
        registered with it."""
        if workers < 1:
            raise StackError(f"--spark-workers {workers}: a cluster needs at least one worker.")
        with self._locked():
            master = self._ensure_running(self.master)
            pending = []
            for worker in self.workers(workers):
                record = worker.running()
                if record is None or not worker.answers(record):
                    if record is not None:
                        worker.stop()
                    record = worker.start(worker.load())
                    worker.save(record)
                pending.append((worker, record))
            for worker, record in pending:  # they start in parallel; wait for each
                worker.wait_registered(record)
            return master.endpoint

    def up_hdfs(self) -> str:
        """Start HDFS (a NameNode and a DataNode) on loopback, reusing a running one;
        return its ``hdfs://`` URL."""
        with self._locked():
            self.hdfs.check_installed()
            return self._ensure_running(self.hdfs).endpoint

    def hdfs_url(self) -> str | None:
        """The ``hdfs://`` URL of this stack's HDFS when it runs."""
        record = self.hdfs.running()
        return record.endpoint if record is not None else None

    def webhdfs_url(self) -> str | None:
        """The NameNode's WebHDFS endpoint (what sinks write their checkpoint record
        through) when this stack's HDFS runs."""
        record = self.hdfs.running()
        return f"http://{LOOPBACK}:{record.ports[1]}" if record is not None else None

    def down_hdfs(self) -> bool:
        with self._locked():
            return self.hdfs.stop()

    def spark_master(self) -> str | None:
        """The URL of this stack's Spark master when it runs."""
        record = self.master.running()
        return record.endpoint if record is not None else None

    def down_spark(self) -> list[str]:
        """Stop the cluster's workers (and their executors), then its master."""
        with self._locked():
            return self._stop_spark()

    def _stop_spark(self) -> list[str]:
        started = sorted(p.name for p in self.root.glob("spark-worker-*") if p.is_dir())
        workers = self.workers(len(started))
        return [s.name for s in [*workers, self.master] if s.stop()]

    def up(self, kafka_brokers: int | None = None) -> Endpoints:
        """Start every service that is not running; idempotent. ``kafka_brokers``: 1, or
        3 or more for a replicated Kafka (None: as the stack last ran).

        A stack already up answers without waiting for the lock, which another process
        may hold for minutes while it starts HDFS or Spark beside the running services
        (scripts/test.sh does, as the first tests begin: one of them waited 51 s)."""
        if kafka_brokers is None and self.is_up():
            with suppress(StackError):  # something went down meanwhile: start it
                return self._endpoints_locked()
        with self._locked():
            if kafka_brokers is not None:
                self._choose_brokers(kafka_brokers)
            for service in self.services.values():
                service.check_installed()
            cluster = self.cluster
            if cluster is not None:
                cluster.up()
            for service in self._running_services():
                self._ensure_running(service)
            return self._endpoints_locked()

    def down(self) -> list[str]:
        """Stop the services this stack started; return the names stopped."""
        with self._locked():
            spark = self._stop_spark()
            stopped = [s.name for s in [*reversed(self.services.values()), self.hdfs] if s.stop()]
            cluster = self.cluster
            if cluster is not None:
                stopped += cluster.down()
            (self.root / "kafka-brokers").unlink(missing_ok=True)
            return spark + stopped

    def restart(self, name: str) -> ServiceStatus:
        """Stop and start one service (a cluster's ``kafka-<n>`` too) on the same ports,
        cleanly (for fault tests and rolling restarts)."""
        with self._locked():
            node = self._node(name)
            if node is not None:
                assert self.cluster is not None
                self.cluster.stop(node)
                self.cluster.start(node)
            else:
                service = self._service(name)
                service.stop()
                self._ensure_running(service)
        return next(s for s in self.status() if s.name == name)

    def kill(self, name: str) -> None:
        """SIGKILL one service (a cluster's ``kafka-<n>`` too) and its worker processes,
        the way a crash would stop them; returns once they are gone, so ``up`` can
        start it again."""
        node = self._node(name)
        if node is not None:
            assert self.cluster is not None
            self.cluster.kill(node)
            return
        record = self._service(name).running()
        if record is not None:
            crash(record.pid)

    @contextmanager
    def frozen(self, name: str) -> Iterator[None]:
        """Within the block, one service (``postgres`` or ``redis``) and every process it
        started are stopped with SIGSTOP, as a frozen server is: the kernel still accepts
        and acknowledges, nothing answers, nothing is closed. SIGCONT on the way out."""
        record = self._service(name).running()
        if record is None:
            raise StackError(f"{name} is not running: nothing to freeze.")
        stopped = [record.pid, *descendants(record.pid)]  # PostgreSQL's backends too
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in stopped:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def _node(self, name: str) -> int | None:
        """The cluster node ``kafka-<n>`` names, None for another service; StackError
        for a node the stack does not run."""
        if not name.startswith("kafka-"):
            return None
        cluster = self.cluster
        number = name.removeprefix("kafka-")
        if cluster is None or not number.isdigit() or int(number) not in cluster.node_ids():
            brokers = self.kafka_brokers
            raise StackError(
                f"No Kafka node {name!r}: the stack runs {brokers} broker(s)"
                + ("" if brokers > 1 else "; `eos stack up --kafka-brokers 3` runs a cluster")
                + "."
            )
        return int(number)

    def status(self) -> list[ServiceStatus]:
        result = []
        cluster = self.cluster
        if cluster is not None:
            ports = cluster.layout().ports
            for node in cluster.node_ids():
                pid = cluster.pid(node)
                endpoint = f"{LOOPBACK}:{ports[node - 1][0]}" if pid else None
                result.append(ServiceStatus(cluster.name(node), pid is not None, pid, endpoint))
        for service in self._running_services():
            record = service.running()
            result.append(
                ServiceStatus(
                    service.name,
                    record is not None,
                    record.pid if record else None,
                    record.endpoint if record else None,
                )
            )
        hdfs = self.hdfs.running()
        if hdfs is not None:
            result.append(ServiceStatus(self.hdfs.name, True, hdfs.pid, hdfs.endpoint))
        return result

    def is_up(self) -> bool:
        """Every service ``up`` starts runs (HDFS and Spark are extras, not counted)."""
        return all(s.running for s in self.status() if s.name != self.hdfs.name)

    def endpoints(self) -> Endpoints:
        """Endpoints of a running stack; StackError naming what is down otherwise."""
        with self._locked():
            return self._endpoints_locked()

    def _endpoints_locked(self) -> Endpoints:
        records = {s.name: s.running() for s in self._running_services()}
        down = [name for name, record in records.items() if record is None]
        cluster = self.cluster
        if cluster is not None:
            down += [cluster.name(n) for n in cluster.node_ids() if cluster.pid(n) is None]
        if down:
            raise StackError(
                f"Not running: {', '.join(down)}. Start the stack with `eos stack up`."
            )
        postgres, redis = records["postgres"], records["redis"]
        assert postgres is not None and redis is not None
        if cluster is not None:  # a plain listener per node, no SASL ones
            layout = cluster.layout()
            return Endpoints(
                layout.bootstrap,
                postgres.endpoint,
                redis.endpoint,
                kafka_proxied=layout.proxied_addresses,
            )
        kafka = records["kafka"]
        assert kafka is not None and isinstance(self.services["kafka"], KafkaService)
        return Endpoints(
            kafka_bootstrap=kafka.endpoint,
            postgres_dsn=postgres.endpoint,
            redis_url=redis.endpoint,
            kafka_sasl=self.services["kafka"].sasl(kafka),
            kafka_proxied=self.services["kafka"].proxied(kafka),
        )

    def _ensure_running(self, service: Service) -> ServiceRecord:
        record = service.running()
        if record is not None and service.answers(record):
            return record
        if record is not None:  # alive but not answering: a wedged server of ours
            service.stop()
        record = service.start(service.load())
        service.save(record)
        return record

    def _service(self, name: str) -> Service:
        try:
            return self.services[name]
        except KeyError as exc:
            raise StackError(
                f"Unknown service {name!r}; one of {', '.join(self.services)}."
            ) from exc

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
