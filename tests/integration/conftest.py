from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from eos_connectors.dev.endpoints import Endpoints

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark(endpoints: Endpoints) -> Iterator[SparkSession]:
    from eos_connectors.ops.spark import local_session

    session = local_session("eos-tests")
    yield session
    session.stop()
