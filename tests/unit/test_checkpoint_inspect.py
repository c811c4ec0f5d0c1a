"""``eos checkpoint inspect`` on a checkpoint whose source is not Kafka (a ``rate`` source
writes a number as its offset): shown as written, never a crash. The checkpoint is
written by hand as Spark lays it out. Cost: well under a second."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eos_connectors.cli import main
from eos_connectors.ops.checkpoint import CheckpointError, read_checkpoint
from eos_connectors.ops.inspect import inspect, report_text


def _rate_checkpoint(path: Path) -> Path:
    (path / "offsets").mkdir(parents=True)
    (path / "commits").mkdir()
    (path / "metadata").write_text(json.dumps({"id": "5f1c0d1e-rate"}))
    metadata = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
    (path / "offsets" / "3").write_text(f"v1\n{json.dumps(metadata)}\n42")
    (path / "commits" / "3").write_text('v1\n{"nextBatchWatermarkMs":0}')
    return path


def test_a_source_that_is_not_kafka_is_shown_as_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("EOS_KAFKA_BOOTSTRAP", "EOS_POSTGRES_DSN", "EOS_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    path = _rate_checkpoint(tmp_path / "checkpoint")
    report = inspect(read_checkpoint(str(path)), None)
    assert report["sources"] == [{"index": 0, "offsets": 42}]
    assert "  offset 42" in report_text(report).splitlines()
    assert main(["checkpoint", "inspect", str(path)]) == 0
    assert "Query id    5f1c0d1e-rate" in capsys.readouterr().out


def test_a_continuous_runs_checkpoint_is_shown_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A continuous run leaves ``offsets/N`` with an empty metadata line (a JSON decode
    error with a traceback, before)."""
    for name in ("EOS_KAFKA_BOOTSTRAP", "EOS_POSTGRES_DSN", "EOS_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "checkpoint"
    (path / "offsets").mkdir(parents=True)
    (path / "metadata").write_text(json.dumps({"id": "5f1c0d1e-continuous"}))
    (path / "offsets" / "0").write_text('v1\n\n{"t":{"0":5,"1":7}}')
    report = inspect(read_checkpoint(str(path)), None)
    assert report["continuous_processing"] is True
    assert report["sources"][0]["offsets"] == {"t-0": 5, "t-1": 7}
    assert main(["checkpoint", "inspect", str(path)]) == 0
    assert "Trigger     the last offsets were written under continuous" in capsys.readouterr().out


def test_a_commit_file_that_is_not_json_is_named(tmp_path: Path) -> None:
    """The state format is read from the last commit: a damaged one is named, never a
    JSON traceback."""
    path = _rate_checkpoint(tmp_path / "checkpoint")
    (path / "commits" / "3").write_text("v1\n{not json")
    with pytest.raises(CheckpointError, match=r"commits/3 is not a Spark commit file"):
        read_checkpoint(str(path))


def test_a_sink_ahead_of_the_checkpoint_is_named(tmp_path: Path) -> None:
    """A sink that decided past the checkpoint's last planned batch (an older copy put
    back) is flagged, so the operator sees why a restart is refused."""
    from eos_connectors.core.protocol import Lineage
    from eos_connectors.core.sinks_admin import SinkRecord

    checkpoint = read_checkpoint(str(_rate_checkpoint(tmp_path / "checkpoint")))
    owner = Lineage("5f1c0d1e-rate")
    sinks = [
        SinkRecord("postgres", "level", owner, "t", 3, ()),
        SinkRecord("redis", "ahead", owner, "k:", 7, ()),
    ]
    report = inspect(checkpoint, sinks)
    assert [s["ahead_of_checkpoint"] for s in report["sinks"]] == [False, True]
    text = report_text(report)
    assert text.count("past this checkpoint's last planned batch") == 1
    assert "Sink ahead in redis (k:): last decided batch 7" in text


def test_a_sink_that_decided_the_last_batch_over_other_positions_is_named(tmp_path: Path) -> None:
    """A checkpoint put back by one batch, its restart refused: it planned the sink's last
    decided batch again, over other source positions than the decision recorded. Batch
    numbers alone show nothing amiss; the positions' digest does. A store that keeps no
    digest is not flagged."""
    from eos_connectors.core.checkpoint_behind import planned_offsets
    from eos_connectors.core.protocol import Lineage
    from eos_connectors.core.sinks_admin import SinkRecord

    path = _rate_checkpoint(tmp_path / "checkpoint")
    checkpoint = read_checkpoint(str(path))
    assert checkpoint.planned_over == planned_offsets((path / "offsets" / "3").read_text())
    other = planned_offsets('v1\n{"batchTimestampMs":0}\n7')
    owner = Lineage("5f1c0d1e-rate")
    sinks = [
        SinkRecord("postgres", "same", owner, "t", 3, (), None, checkpoint.planned_over),
        SinkRecord("redis", "moved", owner, "k:", 3, (), None, other),
        SinkRecord("kafka", "unknown", owner, "topic", 3, ()),
    ]
    report = inspect(checkpoint, sinks)
    assert [s["replanned"] for s in report["sinks"]] == [False, True, False]
    assert not any(s["ahead_of_checkpoint"] for s in report["sinks"])
    text = report_text(report)
    assert text.count("over other source positions than this checkpoint plans") == 1
    assert text.index("Sink moved") < text.index("over other source positions")
