"""Locations: which strings are local paths and which go through Hadoop's file systems."""

from __future__ import annotations

from pathlib import Path

import pytest

from eos_connectors.core.checkpoint_sinks import checkpoint_files
from eos_connectors.core.webhdfs import WebHdfs
from eos_connectors.ops.locations import HadoopPath, location


def test_local_paths_and_file_uris_are_paths_other_schemes_hadoop_paths() -> None:
    assert location("/tmp/ck") == Path("/tmp/ck")
    assert location("file:///tmp/ck") == Path("/tmp/ck")
    assert location("relative/ck") == Path("relative/ck")
    hdfs = location("hdfs://nn:8020/ck/q1/")
    assert isinstance(hdfs, HadoopPath) and str(hdfs) == "hdfs://nn:8020/ck/q1"
    assert isinstance(location("s3a://bucket/ck"), HadoopPath)


def test_hadoop_paths_join_and_split_like_pathlib() -> None:
    base = HadoopPath("hdfs://nn:8020/ck")
    assert str(base / "state" / "0") == "hdfs://nn:8020/ck/state/0"
    assert (base / "offsets").name == "offsets" and (base / "offsets").parent == base
    assert str(base.with_name("ck.retired-1")) == "hdfs://nn:8020/ck.retired-1"
    assert str((base / "a" / "b").relative_to(base)) == "a/b"


def test_sinks_record_on_local_and_hdfs_checkpoints_only() -> None:
    assert checkpoint_files(None) is None and checkpoint_files("s3a://b/ck") is None
    assert checkpoint_files("/tmp/ck") is not None
    hdfs = checkpoint_files("hdfs://nn.example:8020/ck/")
    assert hdfs is not None and getattr(hdfs, "root", None) == "/ck"


def test_webhdfs_defaults_to_the_namenodes_http_port(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EOS_WEBHDFS_URL", raising=False)
    assert WebHdfs.for_uri("hdfs://nn.example:8020/ck").base == "http://nn.example:9870"
    monkeypatch.setenv("EOS_WEBHDFS_URL", "http://gateway:50070/")
    assert WebHdfs.for_uri("hdfs://ns1/ck").base == "http://gateway:50070"


def test_unfinished_writes_are_temporary_files_whose_batch_file_never_came(
    tmp_path: Path,
) -> None:
    from eos_connectors.ops.checkpoint import remove_unfinished_writes, unfinished_writes

    offsets, commits = tmp_path / "offsets", tmp_path / "commits"
    offsets.mkdir()
    commits.mkdir()
    done = "3f2c1d9e-1b2a-4c3d-8e9f-0a1b2c3d4e5f"
    for name in ("0", "1", f".1.{done}.tmp", f".2.{done}.tmp", f"..2.{done}.tmp.crc"):
        (offsets / name).write_text("x")
    (commits / f".1.{done}.tmp").write_text("x")
    assert [p.name for p in unfinished_writes(tmp_path)] == [
        f"..2.{done}.tmp.crc",
        f".2.{done}.tmp",
        f".1.{done}.tmp",
    ]
    assert len(remove_unfinished_writes(tmp_path)) == 3
    assert sorted(p.name for p in offsets.iterdir()) == [".1." + done + ".tmp", "0", "1"]
