"""What every service of the local stack provides, and the record it leaves on disk."""

from __future__ import annotations

import json
import signal
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar

from eos_connectors.dev.stack.process import owned_pid, terminate


@dataclass(frozen=True)
class ServiceRecord:
    """A started server: its pid, the loopback ports it listens on, the URL clients use."""

    name: str
    pid: int
    ports: tuple[int, ...]
    endpoint: str

    @classmethod
    def from_json(cls, text: str) -> ServiceRecord:
        raw = json.loads(text)
        return cls(raw["name"], int(raw["pid"]), tuple(raw["ports"]), raw["endpoint"])

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)


class Service(ABC):
    """One server of the stack, with all its files under ``root/<name>``."""

    name: ClassVar[str]

    def __init__(self, root: Path) -> None:
        self.dir = root / self.name
        self.log_path = self.dir / f"{self.name}.log"

    @property
    def record_path(self) -> Path:
        return self.dir / "service.json"

    @property
    @abstractmethod
    def marker(self) -> Path:
        """A path that appears on the server's command line, proving the process is ours."""

    @abstractmethod
    def check_installed(self) -> None:
        """Raise StackError with install instructions when the server's software is missing."""

    @abstractmethod
    def start(self, previous: ServiceRecord | None) -> ServiceRecord:
        """Start the server (reusing ``previous`` ports when free) and wait until it answers."""

    @abstractmethod
    def answers(self, record: ServiceRecord) -> bool:
        """True when the server answers a real request at ``record.endpoint``."""

    def load(self) -> ServiceRecord | None:
        if not self.record_path.exists():
            return None
        return ServiceRecord.from_json(self.record_path.read_text())

    def save(self, record: ServiceRecord) -> None:
        self.record_path.parent.mkdir(parents=True, exist_ok=True)
        self.record_path.write_text(record.to_json())

    def running(self) -> ServiceRecord | None:
        """The record of this stack's server when its process is alive and ours."""
        record = self.load()
        if record is not None and owned_pid(record.pid, self.marker):
            return record
        return None

    def stop(self) -> bool:
        """Stop the server if this stack started it; True when something was stopped."""
        record = self.running()
        if record is None:
            return False
        terminate(record.pid, timeout=60, sig=self.stop_signal)
        return True

    stop_signal: ClassVar[int] = signal.SIGTERM
