"""The local service stack: real Kafka, PostgreSQL and Redis without Docker.

``Stack(root).up()`` starts what is not running (reusing what is) and returns the
endpoints; ``down()`` stops only the processes this stack started. Everything the
stack writes lives under one root directory (``EOS_STACK_DIR``); the Kafka jars
are resolved once into a per-user cache (``EOS_CACHE_DIR``).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from eos_connectors.core.errors import StackError
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.stack.kafka import KAFKA_SETTINGS, KAFKA_VERSION, KafkaService
from eos_connectors.dev.stack.postgres import POSTGRES_SETTINGS, PostgresService
from eos_connectors.dev.stack.process import crash
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
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or default_root()
        self.services: dict[str, Service] = {
            s.name: s
            for s in (KafkaService(self.root), PostgresService(self.root), RedisService(self.root))
        }
        self.master = SparkMaster(self.root)

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

    def up(self) -> Endpoints:
        """Start every service that is not running; idempotent."""
        with self._locked():
            for service in self.services.values():
                service.check_installed()
            for service in self.services.values():
                self._ensure_running(service)
            return self._endpoints_locked()

    def down(self) -> list[str]:
        """Stop the services this stack started; return the names stopped."""
        with self._locked():
            spark = self._stop_spark()
            return spark + [s.name for s in reversed(self.services.values()) if s.stop()]

    def restart(self, name: str) -> ServiceRecord:
        """Stop and start one service on the same ports (for fault tests)."""
        service = self._service(name)
        with self._locked():
            service.stop()
            return self._ensure_running(service)

    def kill(self, name: str) -> None:
        """SIGKILL one service and its worker processes, the way a crash would stop
        them; returns once they are gone, so ``up`` can start it again."""
        service = self._service(name)
        record = service.running()
        if record is not None:
            crash(record.pid)

    def status(self) -> list[ServiceStatus]:
        result = []
        for service in self.services.values():
            record = service.running()
            result.append(
                ServiceStatus(
                    service.name,
                    record is not None,
                    record.pid if record else None,
                    record.endpoint if record else None,
                )
            )
        return result

    def is_up(self) -> bool:
        return all(s.running for s in self.status())

    def endpoints(self) -> Endpoints:
        """Endpoints of a running stack; StackError naming what is down otherwise."""
        with self._locked():
            return self._endpoints_locked()

    def _endpoints_locked(self) -> Endpoints:
        records = {name: s.running() for name, s in self.services.items()}
        down = [name for name, record in records.items() if record is None]
        if down:
            raise StackError(
                f"Not running: {', '.join(down)}. Start the stack with `eos stack up`."
            )
        kafka = records["kafka"]
        assert kafka is not None and isinstance(self.services["kafka"], KafkaService)
        return Endpoints(
            kafka_bootstrap=kafka.endpoint,
            postgres_dsn=records["postgres"].endpoint,  # type: ignore[union-attr]
            redis_url=records["redis"].endpoint,  # type: ignore[union-attr]
            kafka_sasl=self.services["kafka"].sasl(kafka),
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
