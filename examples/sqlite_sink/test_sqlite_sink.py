"""The example sink passes the package's contract suite (no Spark, no server)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from eos_connectors.core.protocol import TwoPhaseCommitWriter
from eos_connectors.testing import CONTRACT_SCHEMA, SinkContract
from examples.sqlite_sink import SqliteDataSource, counts


class TestSqliteSink(SinkContract):
    @pytest.fixture(autouse=True)
    def _target(self, tmp_path: Path) -> None:
        self.path = str(tmp_path / "sink.db")

    def new_writer(self, sink_id: str | None = None) -> TwoPhaseCommitWriter:
        options = {
            "path": self.path,
            "table": "totals",
            "keyColumn": "word",
            "valueColumn": "n",
            "mode": "add",
        }
        if sink_id:
            options["sinkId"] = sink_id
        writer = SqliteDataSource(options).streamWriter(CONTRACT_SCHEMA, False)
        assert isinstance(writer, TwoPhaseCommitWriter)
        return writer

    def visible(self) -> Mapping[str, int]:
        return counts(self.path, "totals")
