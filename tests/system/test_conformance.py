"""The conformance cells on a real Spark pipeline: every fault point of every sink fires in
its own query, Redis is restarted, and every sink ends exact (the whole pipeline killed at
random moments: test_connect in CI, make soak's `eos verify` runs).

One harness run (``eos verify``) holds every query of the three cells (see
connectors/harness/cells.py) plus the example SQLite sink of a connector author
(examples/sqlite_sink), each addressed by its own fault points.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from eos_connectors.core.faults import Entry
from eos_connectors.core.topics import read_to_end
from eos_connectors.dev.endpoints import Endpoints
from eos_connectors.dev.harness.cells import CELLS, KAFKA_POINTS, TWO_PHASE_POINTS, late_records
from eos_connectors.dev.harness.verify import MIXED_GROUP_CRASHES, CustomSink, Names, Report
from examples.sqlite_sink import counts

pytestmark = [pytest.mark.services, pytest.mark.spark]

_SQLITE: dict[str, str] = {}


def read_sqlite() -> dict[str, int]:
    """The --sink-reader of the example sink: what its table holds."""
    return counts(_SQLITE["path"], "counts")


def test_every_cell_crosses_every_point_of_every_sink(
    endpoints: Endpoints, eos_verify: Callable[..., Report], tmp_path: Path
) -> None:
    _SQLITE["path"] = str(tmp_path / "example-sink.db")
    options = (
        ("path", _SQLITE["path"]),
        ("table", "counts"),
        ("keyColumn", "word"),
        ("valueColumn", "count"),
        ("mode", "upsert"),
    )
    custom = CustomSink(
        "eos_sqlite", f"{__name__}:read_sqlite", options, "examples.sqlite_sink:SqliteDataSource"
    )
    report = eos_verify(
        records=4_000, cells=tuple(CELLS), custom=custom, kills=0, restarts=("redis",)
    )
    print(report.table(), report.fault_table(), sep="\n")
    assert report.ok, (report.problems, report.table(), [s.leftovers for s in report.sinks])

    queries = {s.sink for s in report.sinks}
    assert queries == {f"{c.short}-{sink}" for c in CELLS.values() for sink, _ in c.sinks} | {
        "rc-custom"
    }
    # Every point of every sink fired, in the query it was addressed to.
    schedule = report.plan["schedule"]
    assert set(report.fired) == set(schedule), "a planned fault point never fired"
    for entry, where in report.fired.items():
        assert where["query"] == Entry.parse(entry).query, f"{entry} fired in {where}"
    crossed = {(Entry.parse(e).query, Entry.parse(e).point) for e in schedule}
    for query in queries:
        points = KAFKA_POINTS if "-kafka" in query else TWO_PHASE_POINTS
        assert {(query, p) for p in points} <= crossed, f"{query} missed a point"
    whole = [e for e in schedule if Entry.parse(e).action == "group"]
    restarts_records = [e for e in whole if Entry.parse(e).query == "rec-kafka-records"]
    assert len(whole) == MIXED_GROUP_CRASHES + len(restarts_records), whole
    assert restarts_records, "the records cell restarts its query with another minPartitions"
    assert len(_min_partitions(report)) > 1, "minPartitions never changed between starts"
    # The run the group point ended was a crash, plus the Redis crash.
    assert report.crashes >= len({report.run_of(e) for e in whole}) + 1
    assert all(s.expected > 1_000 for s in report.sinks)

    # The event-time cell's input had records that are late however the batches fall
    # (the sinks matched an expectation without them), and its tail.
    timed = read_to_end(endpoints.kafka, Names(_tag(report)).timed)
    assert late_records(timed, report.plan["batch_offsets"]) > 20


def _min_partitions(report: Report) -> list[int]:
    """The records cell's minPartitions at each start, from the runs' event lines."""
    from eos_connectors.dev.harness.pipeline import parse_event

    found = []
    for log in sorted(Path(report.plan["work_dir"]).glob("run-*.log")):
        for line in log.read_text(errors="replace").splitlines():
            event = parse_event(line)
            if event is not None and event.get("event") == "min-partitions":
                found.append(int(event["min_partitions"]))
    return found


def _tag(report: Report) -> str:
    spec = (Path(report.plan["work_dir"]) / "pipeline.json").read_text()
    return spec.split("verify-in-timed-", 1)[1].split('"', 1)[0]
