"""Fixtures of the whole-pipeline tests: a second stack whose Kafka is three brokers."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from eos_connectors.dev.stack import Stack
from eos_connectors.dev.stack.kafka import JIT_SETTING
from eos_connectors.dev.stack.kafka_cluster import KafkaCluster
from tests.pipeline_util import ROOT, env

#: What ``eos_on`` keeps of the session's ``EOS_*`` settings: its HDFS's WebHDFS (the sinks
#: record themselves in checkpoints there) and how the brokers compile (scripts/test.sh).
KEPT = ("EOS_WEBHDFS_URL", JIT_SETTING)


def eos_on(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``eos`` on the stack under ``root``, with no endpoints from the session's stack."""
    environment = {k: v for k, v in env().items() if not k.startswith("EOS_") or k in KEPT}
    environment["EOS_STACK_DIR"] = str(root)
    command = [sys.executable, "-m", "eos_connectors.cli", *args]
    return subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, check=False
    )


@pytest.fixture(scope="session")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The root of a stack whose Kafka is three brokers (PostgreSQL's OS user must reach
    it when the tests run as root, as in test_stack)."""
    base = Path("/var/lib/eos-connectors") if os.geteuid() == 0 else tmp_path_factory.mktemp("r")
    root = base / f"test-replicated-{os.getpid()}"
    try:
        up = eos_on(root, "stack", "up", "--kafka-brokers", "3")
        assert up.returncode == 0, up.stderr
        switch = eos_on(root, "stack", "up", "--kafka-brokers", "1")
        assert switch.returncode != 0 and "stop it first" in switch.stderr
        status = eos_on(root, "stack", "status").stdout
        assert [line.split()[0] for line in status.splitlines()][:3] == [
            "kafka-1",
            "kafka-2",
            "kafka-3",
        ]
        yield root
    finally:
        made = Stack(root).cluster
        down = eos_on(root, "stack", "down")
        left = [n for n in made.node_ids() if made.pid(n) is not None] if made else []
        shutil.rmtree(root, ignore_errors=True)
    # every broker stopped (the last test may have left one killed: see cluster)
    assert made is not None and down.returncode == 0, down.stdout + down.stderr
    assert "kafka-" in down.stdout and not left, down.stdout + down.stderr


@pytest.fixture
def cluster(replicated: Path) -> KafkaCluster:
    """The three brokers, each running. A test that kills one need not start it again:
    this starts it for the next test that asks (the last test of a CI run, the controller
    killed, saved a broker's start, ~8 s and ~6 core-seconds)."""
    made = Stack(replicated).cluster
    assert made is not None
    for node in made.node_ids():
        if made.pid(node) is None:
            made.start(node)
    return made
