"""examples/quickstart.py, the README's quickstart, runs as it is against the services
and counts each word once; a second run counts the new words and none twice. Cost: ~8 s
(two availableNow queries)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from eos_connectors.dev.endpoints import Endpoints
from examples import quickstart

pytestmark = [pytest.mark.services, pytest.mark.spark]


@pytest.mark.cost(8)
def test_the_readmes_quickstart_counts_each_word_once(
    spark: SparkSession,
    endpoints: Endpoints,
    unique: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(quickstart, "KAFKA", endpoints.kafka_bootstrap)
    monkeypatch.setattr(quickstart, "POSTGRES", endpoints.postgres_dsn)
    run = {"topic": f"qs-{unique}", "table": f"qs_{unique}", "checkpoint": str(tmp_path / "cp")}
    once = Counter(quickstart.WORDS)
    assert dict(quickstart.main(spark, **run)) == dict(once)
    assert dict(quickstart.main(spark, **run)) == {w: 2 * n for w, n in once.items()}
