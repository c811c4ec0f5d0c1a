"""HDFS on loopback: a NameNode and a DataNode in one JVM, for checkpoints on shared storage.

Hadoop's own mini cluster (``hadoop-client-minicluster`` from Maven Central, at the
Hadoop version the installed PySpark ships its client for) is the same NameNode and
DataNode code a production HDFS runs, with real RPC, block replication to the DataNode,
atomic renames and WebHDFS; only the daemons share a process. Spark reaches it through
the ``hdfs:`` file system already in its jars, so a query's ``checkpointLocation`` of
``hdfs://127.0.0.1:<port>/...`` is a checkpoint on a distributed file system. Data lives
under ``root/hdfs`` and survives a restart; ``eos stack down`` stops it.
"""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from eos_connectors.core.errors import StackError
from eos_connectors.dev.stack.kafka import INSTALL_HINT, maven_jars
from eos_connectors.dev.stack.process import (
    LOOPBACK,
    free_port,
    pid_alive,
    require_binary,
    spawn,
    terminate,
    wait_until,
)
from eos_connectors.dev.stack.service import Service, ServiceRecord
from eos_connectors.ops.cache import cache_root
from eos_connectors.ops.spark_home import installed_spark_home

#: The mini cluster's class path needs JUnit (its test utilities name the data
#: directory through JUnit's assertions), which the shaded jar leaves out, and JAXB's
#: API, which Java 11 dropped from the JDK: Hadoop 3.4's WebHDFS (PySpark 4.0-4.1's
#: Hadoop) answers every request with an error 500 without it (3.5 no longer needs it).
_EXTRA = (
    ("org.junit.jupiter", "junit-jupiter-api", "5.10.2"),
    ("junit", "junit", "4.13.2"),
    ("javax.xml.bind", "jaxb-api", "2.3.1"),
)
_MAIN = "org.apache.hadoop.mapreduce.MiniHadoopClusterManager"
START_TIMEOUT = 120.0
_NAMENODE_INFO = "Hadoop:service=NameNode,name=NameNodeInfo"


def hadoop_version() -> str:
    """The Hadoop client version in the installed PySpark's jars (its HDFS client)."""
    for jar in (installed_spark_home() / "jars").glob("hadoop-client-api-*.jar"):
        found = re.match(r"hadoop-client-api-(.+)\.jar$", jar.name)
        if found:
            return found.group(1)
    raise StackError("The installed PySpark ships no hadoop-client-api jar: cannot pick HDFS.")


def _pom(version: str) -> str:
    deps = (("org.apache.hadoop", "hadoop-client-minicluster", version), *_EXTRA)
    listed = "".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>\n"
        for g, a, v in deps
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        "  <groupId>eos-connectors</groupId><artifactId>hdfs</artifactId><version>1</version>\n"
        f"  <dependencies>\n{listed}  </dependencies>\n</project>\n"
    )


def ensure_jars() -> Path:
    """Resolve the mini cluster's jars with Maven (once per version); return their dir."""
    version = hadoop_version()
    return maven_jars(
        cache_root() / f"hadoop-minicluster-{version}", _pom(version), "Resolving HDFS"
    )


class HdfsService(Service):
    """The HDFS of the stack: ``hdfs://127.0.0.1:<rpc port>``; WebHDFS on the second port."""

    name = "hdfs"

    @property
    def marker(self) -> Path:
        return self.dir / "hdfs-site.xml"  # written by the cluster at start: on its command line

    def check_installed(self) -> None:
        require_binary("java", INSTALL_HINT)
        require_binary("mvn", INSTALL_HINT)

    def start(self, previous: ServiceRecord | None) -> ServiceRecord:
        jars = ensure_jars()
        rpc = free_port(previous.ports[0] if previous else None)
        web = free_port(previous.ports[1] if previous else None)
        self.dir.mkdir(parents=True, exist_ok=True)
        data = self.dir / "target" / "test" / "data"  # the mini cluster's base, under its cwd
        argv = [
            require_binary("java", INSTALL_HINT),
            "-Xmx768m",
            "-cp",
            f"{jars}/*",
            _MAIN,
            "-nomr",
            "-datanodes",
            "1",
            "-nnport",
            str(rpc),
            "-nnhttpport",
            str(web),
            *(() if data.exists() else ("-format",)),
            "-D",
            f"dfs.namenode.rpc-bind-host={LOOPBACK}",
            "-D",
            "dfs.permissions.enabled=false",
            "-writeConfig",
            str(self.marker),
        ]
        pid = spawn(argv, self.log_path, self.dir)
        record = ServiceRecord(self.name, pid, (rpc, web), f"hdfs://{LOOPBACK}:{rpc}")
        try:
            wait_until(
                lambda: self.answers(record) and self.marker.exists(),
                START_TIMEOUT,
                f"HDFS on port {rpc}",
                alive=lambda: pid_alive(pid),
                log_path=self.log_path,
            )
        except StackError:
            terminate(pid)  # a start that never answered leaves no JVM behind
            raise
        return record

    def answers(self, record: ServiceRecord) -> bool:
        """The NameNode answers WebHDFS and is out of safe mode (the DataNode reported)."""
        url = f"http://{LOOPBACK}:{record.ports[1]}/webhdfs/v1/?op=GETFILESTATUS"
        try:
            with urllib.request.urlopen(url, timeout=2) as page:
                if page.status != 200:
                    return False
            jmx = f"http://{LOOPBACK}:{record.ports[1]}/jmx?qry={_NAMENODE_INFO}"
            with urllib.request.urlopen(jmx, timeout=2) as page:
                text = page.read().decode()
        except OSError:
            return False
        return '"Safemode" : ""' in text and '"LiveNodes" : "{}"' not in text
