"""The Kafka sink's marker log records keep the source positions of the batch they mark
(``commitMode=task``), and the driver hands the tasks the digest of the batch Spark made
the writer for, never another's. No broker. Cost: <1 s."""

from __future__ import annotations

import json
from pathlib import Path

from eos_connectors.core.checkpoint_behind import planned_offsets
from eos_connectors.sinks.kafka import KafkaExactlyOnceWriter
from eos_connectors.sinks.kafka.format import planned_at
from eos_connectors.sinks.kafka.marker_log import Marker, decode, encode
from eos_connectors.sinks.kafka.options import parse_options

OPTIONS = parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t"})


def test_a_marker_keeps_its_digest_and_one_written_before_reads_as_unknown() -> None:
    marker = Marker(8, "q", "__eos_markers", "abc123")
    assert decode(encode(marker)) == marker
    plain = Marker(8, "q", "__eos_markers")
    assert "offsets" not in json.loads(encode(plain))
    older = json.dumps({"next_batch": 8, "query": "q", "topic": "__eos_markers"}).encode()
    assert decode(older) == plain and plain.offsets == ""


def _checkpoint(folder: Path, batches: int) -> str:
    for log in ("offsets", "commits"):
        (folder / log).mkdir(parents=True, exist_ok=True)
    for batch in range(batches):
        (folder / "offsets" / str(batch)).write_text(f'v1\n{{"t":{batch}}}\n{{"s":{batch}}}\n')
    return str(folder)


def test_the_writer_hands_its_tasks_the_digest_of_its_own_batch_only(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path / "chk", 3)
    planned = planned_at(checkpoint)
    expected = planned_offsets((tmp_path / "chk" / "offsets" / "2").read_text())
    assert planned == (2, expected)
    writer = KafkaExactlyOnceWriter(OPTIONS, checkpoint, planned)
    assert writer._planned_over(2) == expected
    assert writer._planned_over(1) == "" and writer._planned_over(3) == ""
    assert KafkaExactlyOnceWriter(OPTIONS)._planned_over(2) == ""


def test_a_checkpoint_without_offsets_or_unreadable_plans_nothing(tmp_path: Path) -> None:
    assert planned_at(_checkpoint(tmp_path / "empty", 0)) is None
    assert planned_at(None) is None
    assert planned_at("s3a://bucket/checkpoint") is None
