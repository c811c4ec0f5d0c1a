"""A replicated Apache Kafka on loopback: N nodes in KRaft combined mode (each a broker and
a controller voter), replication factor N, ``min.insync.replicas`` N - 1, the offsets
topic and the transaction state log replicated N times. Production's shape, for the
broker-fault tests: one node can die (the controller quorum and every partition's ISR
keep a majority) and another can be killed on purpose by ``kill(node)``.

Every file lives under ``root/kafka-cluster``: ``cluster.json`` (cluster id and each
node's ports, chosen once and kept, so clients keep the bootstrap they know) and one
directory per node (``node-<n>``: config, data, log, pid).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from eos_connectors.core.errors import StackError
from eos_connectors.dev.stack.kafka import (
    INSTALL_HINT,
    KAFKA_SETTINGS,
    cluster_id,
    ensure_jars,
    format_storage,
    java_command,
    proxied_listener,
)
from eos_connectors.dev.stack.process import (
    LOOPBACK,
    crash,
    free_port,
    owned_pid,
    pid_alive,
    require_binary,
    spawn,
    terminate,
    wait_until,
)


def cluster_settings(nodes: int) -> dict[str, str]:
    """The broker settings of an ``nodes``-node cluster (shared with docker-compose.yml's
    ``cluster`` profile; a test checks that they match)."""
    replicas, min_isr = str(nodes), str(max(1, nodes - 1))
    return {
        **KAFKA_SETTINGS,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "unclean.leader.election.enable": "false",
    }


@dataclass(frozen=True)
class Layout:
    """The cluster's id and each node's (client port, controller port) and its proxied
    listener's (bound port, advertised port), node ids from 1."""

    cluster_id: str
    ports: tuple[tuple[int, int], ...]
    proxied: tuple[tuple[int, int], ...] = ()

    @property
    def proxied_addresses(self) -> tuple[tuple[str, str], ...]:
        """Per node, the proxied listener's (advertised, bound) address."""
        return tuple((f"{LOOPBACK}:{a}", f"{LOOPBACK}:{b}") for b, a in self.proxied)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"{LOOPBACK}:{client}" for client, _ in self.ports)

    @property
    def voters(self) -> str:
        return ",".join(f"{n}@{LOOPBACK}:{c}" for n, (_, c) in enumerate(self.ports, 1))


#: The replicated Kafka runs Kafka's transaction protocol version 1 (the single broker
#: of the stack runs the release's default, 2 on Kafka 4), so the tests cover the
#: Kafka sink's driver commit on both (issue 53); librdkafka speaks version 1 on either.
TRANSACTION_VERSION = 1
FEATURES = (f"transaction.version={TRANSACTION_VERSION}",)


class KafkaCluster:
    """Start, stop, kill and restart the nodes of one local replicated Kafka."""

    def __init__(self, root: Path, nodes: int = 3) -> None:
        if nodes < 3:
            raise StackError(f"A replicated Kafka needs at least 3 brokers, not {nodes}.")
        self.dir = root / "kafka-cluster"
        self.nodes = nodes
        self.heap = os.environ.get("EOS_KAFKA_HEAP", "512m")

    # -- the whole cluster -------------------------------------------------------------

    def up(self) -> str:
        """Start every node that is not running and wait until all are in the cluster;
        return the bootstrap servers."""
        require_binary("java", INSTALL_HINT)
        layout = self.layout()
        for node in self.node_ids():
            if self.pid(node) is None:
                self._spawn(node, layout)
        self.wait_ready(layout)
        return layout.bootstrap

    def down(self, timeout: float = 20) -> list[str]:
        """Stop the running nodes, all at once (one by one, the last would wait for a
        controller quorum that is gone): SIGTERM, then SIGKILL whatever is left after
        ``timeout``; return their names."""
        pids = {n: pid for n in self.node_ids() if (pid := self.pid(n)) is not None}
        for pid in pids.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for pid in pids.values():
            terminate(pid, timeout=max(0.0, deadline - time.monotonic()))
        return [self.name(n) for n in pids]

    def any_running(self) -> bool:
        return any(self.pid(n) is not None for n in self.node_ids())

    @property
    def bootstrap(self) -> str:
        return self.layout().bootstrap

    def layout(self) -> Layout:
        """The cluster's id and ports: chosen on the first start, the same ones after."""
        path = self.dir / "cluster.json"
        if path.exists():
            raw = json.loads(path.read_text())
            ports = tuple((a, b) for a, b in raw["ports"])
            proxied = tuple((a, b) for a, b in raw.get("proxied", ()))
            if proxied:
                return Layout(raw["cluster_id"], ports, proxied)
            layout = Layout(raw["cluster_id"], ports, self._pairs())  # made before proxies
        else:
            layout = Layout(cluster_id(), self._pairs(), self._pairs())
        self.dir.mkdir(parents=True, exist_ok=True)
        raw = {"cluster_id": layout.cluster_id, "ports": layout.ports, "proxied": layout.proxied}
        path.write_text(json.dumps(raw))
        return layout

    def _pairs(self) -> tuple[tuple[int, int], ...]:
        """Two free ports per node."""
        chosen: list[int] = []
        while len(chosen) < 2 * self.nodes:
            port = free_port()
            if port not in chosen:
                chosen.append(port)
        return tuple((chosen[2 * i], chosen[2 * i + 1]) for i in range(self.nodes))

    def wait_ready(self, layout: Layout | None = None, timeout: float = 180) -> None:
        """Until every node is a registered broker of the cluster."""
        layout = layout or self.layout()
        wait_until(
            lambda: len(self.brokers(layout.bootstrap)) == self.nodes,
            timeout=timeout,
            what=f"{self.nodes} Kafka brokers at {layout.bootstrap}",
            alive=lambda: all(self.pid(n) is not None for n in self.node_ids()),
            log_path=self.node_dir(1) / "kafka.log",
        )

    # -- one node ----------------------------------------------------------------------

    def node_ids(self) -> range:
        return range(1, self.nodes + 1)

    def name(self, node: int) -> str:
        return f"kafka-{node}"

    def node_dir(self, node: int) -> Path:
        return self.dir / f"node-{node}"

    def pid(self, node: int) -> int | None:
        """The node's pid when it runs and is this cluster's."""
        pid_file = self.node_dir(node) / "pid"
        if not pid_file.exists():
            return None
        pid = int(pid_file.read_text())
        return pid if owned_pid(pid, self._config(node)) else None

    def kill(self, node: int) -> None:
        """SIGKILL one node, as a machine crash would stop it."""
        pid = self.pid(node)
        if pid is not None:
            crash(pid)

    def stop(self, node: int) -> None:
        """Stop one node cleanly (SIGTERM: it hands its leaderships over first)."""
        pid = self.pid(node)
        if pid is not None:
            terminate(pid, timeout=60, sig=signal.SIGTERM)

    def start(self, node: int) -> None:
        """Start one node on its old ports and wait until the cluster has it again."""
        if self.pid(node) is None:
            self._spawn(node, self.layout())
        self.wait_ready()

    def _config(self, node: int) -> Path:
        return self.node_dir(node) / "server.properties"

    def _spawn(self, node: int, layout: Layout) -> None:
        where = self.node_dir(node)
        where.mkdir(parents=True, exist_ok=True)
        client, controller = layout.ports[node - 1]
        proxied = proxied_listener(*layout.proxied[node - 1])
        free_port(client)  # a killed node's ports may linger in FIN_WAIT2 for a while
        free_port(controller)
        plain, control = f"PLAINTEXT://{LOOPBACK}:{client}", f"CONTROLLER://{LOOPBACK}:{controller}"
        settings = {
            **cluster_settings(self.nodes),
            "node.id": str(node),
            "controller.quorum.voters": layout.voters,
            "listeners": f"{plain},{proxied.bound},{control}",
            "advertised.listeners": f"{plain},{proxied.advertised}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": (
                f"PLAINTEXT:PLAINTEXT,{proxied.security},CONTROLLER:PLAINTEXT"
            ),
            "log.dirs": str(where / "data"),
        }
        self._config(node).write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        java = java_command(where, self.heap, f"{ensure_jars()}/*")
        format_storage(java, self._config(node), layout.cluster_id, where, FEATURES)
        pid = spawn([*java, "kafka.Kafka", str(self._config(node))], where / "kafka.log", where)
        (where / "pid").write_text(str(pid))
        if not pid_alive(pid):
            raise StackError(f"{self.name(node)} exited at once; see {where / 'kafka.log'}")

    # -- who does what -----------------------------------------------------------------

    def brokers(self, bootstrap: str | None = None) -> set[int]:
        """The node ids the cluster's metadata lists as brokers now (empty when none answer)."""
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": bootstrap or self.bootstrap, "log_level": 0})
        try:
            return set(admin.list_topics(timeout=3).brokers)
        except Exception:
            return set()

    def leader(self, topic: str, partition: int, timeout: float = 60) -> int:
        """The node that leads ``topic``'s ``partition`` now; asked again while the cluster
        does not answer or has no leader for it (recovering from an outage)."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        deadline = time.monotonic() + timeout
        while True:
            try:
                meta = admin.list_topics(topic, timeout=10).topics[topic]
                found = meta.partitions.get(partition)
            except KafkaException:  # no broker answered in time: the cluster is recovering
                found = None
            if found is not None and found.leader > 0:
                return int(found.leader)
            if time.monotonic() > deadline:
                raise StackError(f"{topic}[{partition}] has no leader after {timeout:.0f} s")
            time.sleep(0.5)

    def coordinator(self, transactional_id: str, partitions: int = 8) -> int:
        """The node that coordinates ``transactional_id``'s transactions: the leader of
        its partition of ``__transaction_state`` (Kafka's rule: the absolute value of the
        id's Java hashCode modulo the log's partition count)."""
        return self.leader("__transaction_state", java_hash(transactional_id) % partitions)


def java_hash(text: str) -> int:
    """Kafka's ``Utils.abs(text.hashCode())``: Java's ``String.hashCode`` over UTF-16 code
    units, then its absolute value (0 for ``Integer.MIN_VALUE``)."""
    value = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        value = (31 * value + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    signed = value - (1 << 32) if value >= 1 << 31 else value
    return 0 if signed == -(1 << 31) else abs(signed)
