from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from eos_connectors.dev.endpoints import Endpoints

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark(endpoints: Endpoints, request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """The session's local Spark; HDFS first when a selected test keeps its checkpoint
    there (the JVM, and so its Python workers, must start with EOS_WEBHDFS_URL set)."""
    from eos_connectors.ops.session import local_session

    if any(item.get_closest_marker("hdfs") for item in request.session.items):
        request.getfixturevalue("hdfs_url")
    session = local_session("eos-tests")
    yield session
    session.stop()
