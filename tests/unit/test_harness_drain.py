"""The harness's source options on releases without read limits for Python sources."""

from __future__ import annotations

import pytest

from eos_connectors.dev.harness import drain
from eos_connectors.dev.harness.spec import QuerySpec

OURS = QuerySpec("count", "in", "count", "eos_kafka", ())
SPARKS = QuerySpec("count", "in", "count", "kafka", (), source="kafka")


def test_before_4_2_every_query_of_ours_lets_the_source_bound_its_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On 4.0-4.1 the benchmark's continuous queries carry maxOffsetsPerTrigger too,
    # which the source refuses without legacyReadLimits (their trigger is processingTime).
    monkeypatch.setattr(drain, "HAS_READ_LIMITS", False)
    assert drain.source_options(OURS) == {"legacyReadLimits": "true"}
    assert drain.source_options(SPARKS) == {}


def test_from_4_2_spark_bounds_the_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain, "HAS_READ_LIMITS", True)
    assert drain.source_options(OURS) == {}
