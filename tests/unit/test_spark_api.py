"""What the supported PySpark releases differ in (connectors/core/spark_api.py). Costs ~0 s."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql.datasource import DataSourceStreamWriter

from eos_connectors.core import spark_api
from eos_connectors.core.errors import EosError
from eos_connectors.ops.savepoints import rescale
from eos_connectors.sinks.kafka.batch_commit import BatchCommitWriter
from eos_connectors.sinks.postgres.at_least_once import PostgresAtLeastOnceWriter


def test_every_sink_writer_gets_arrow_batches_on_this_release() -> None:
    """4.1+ hands Arrow batches to a DataSourceStreamArrowWriter; 4.0 to any
    DataSourceArrowWriter: the writers are one of them on the release that runs."""
    for writer in (BatchCommitWriter, PostgresAtLeastOnceWriter):
        assert issubclass(writer, spark_api.StreamArrowWriter)
        assert issubclass(writer, DataSourceStreamWriter) or spark_api.SPARK_MINOR >= (4, 1)
    assert (spark_api.SPARK_MINOR >= (4, 2)) == spark_api.HAS_READ_LIMITS


def test_a_rescale_before_pyspark_4_2_is_refused_naming_the_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spark_api, "SPARK_MINOR", (4, 1))
    monkeypatch.setattr(spark_api, "release", lambda: "4.1.4")
    with pytest.raises(EosError, match=r"needs PySpark 4.2 or later .* PySpark 4.1.4 has none"):
        rescale(None, tmp_path / "checkpoint", 4, tmp_path / "savepoints")
    assert not (tmp_path / "savepoints").exists()
