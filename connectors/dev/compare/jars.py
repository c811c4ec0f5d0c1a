"""Spark's own JVM Kafka connector (``spark-sql-kafka-0-10``), the benchmark's baseline.

Maven Central has no ``spark-sql-kafka-0-10`` for Spark 4.3 yet, and its
``spark-token-provider-kafka`` stops at 4.0.0; so the newest connector (4.2.0)
runs on PySpark 4.3 with the 4.0.0 token provider (used only for delegation
tokens). The jars Spark ships already (Scala, slf4j, lz4, snappy) are left out.
"""

from __future__ import annotations

from pathlib import Path

from eos_connectors.dev.stack.kafka import maven_jars
from eos_connectors.ops.cache import cache_root

CONNECTOR_VERSION = "4.2.0"
TOKEN_PROVIDER_VERSION = "4.0.0"  # noqa: S105 (a version, not a secret)
_ARTIFACTS = (
    "spark-sql-kafka-0-10",
    "spark-token-provider-kafka-0-10",
    "kafka-clients",
    "commons-pool2",
)

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>eos-connectors</groupId>
  <artifactId>spark-kafka-baseline</artifactId>
  <version>1</version>
  <dependencies>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>spark-sql-kafka-0-10_2.13</artifactId>
      <version>{connector}</version>
      <exclusions>
        <exclusion>
          <groupId>org.apache.spark</groupId>
          <artifactId>spark-token-provider-kafka-0-10_2.13</artifactId>
        </exclusion>
      </exclusions>
    </dependency>
    <dependency>
      <groupId>org.apache.spark</groupId>
      <artifactId>spark-token-provider-kafka-0-10_2.13</artifactId>
      <version>{token}</version>
      <exclusions>
        <exclusion><groupId>*</groupId><artifactId>*</artifactId></exclusion>
      </exclusions>
    </dependency>
  </dependencies>
</project>
"""


def spark_kafka_jars() -> list[Path]:
    """The connector's jars (resolved with Maven once, then cached next to Kafka's)."""
    cache = cache_root() / f"spark-sql-kafka-{CONNECTOR_VERSION}"
    pom = _POM.format(connector=CONNECTOR_VERSION, token=TOKEN_PROVIDER_VERSION)
    libs = maven_jars(cache, pom, f"Resolving spark-sql-kafka {CONNECTOR_VERSION}")
    return sorted(jar for jar in libs.glob("*.jar") if jar.name.startswith(_ARTIFACTS))
