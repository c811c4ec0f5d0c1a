"""Sinks that each break the protocol in one way (``examples.sqlite_sink.broken``), as
custom sinks of a harness run, and what its report must show for each.

Each adds up every batch's change per word (``mode=add`` of the running count's
``delta``), where a loss or a duplicate shows. The harness imports their readers by
``module:function``, so each kind gets one here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from eos_connectors.dev.harness.cells import CustomSink
from eos_connectors.dev.harness.report import Report
from examples.sqlite_sink import counts
from examples.sqlite_sink.broken import BROKEN, in_doubt

#: What the report must show for each broken sink.
EXPECTED = {
    "partition": "lost",
    "replay": "duplicated",
    "prepare": "duplicated",
    "rollback": "leftovers",
    "overwrite": "lost",
}
#: One per column of the report, for CI; make soak runs every one.
CI_BROKEN = ("partition", "replay", "rollback")
#: The fault points that show each flaw, crossed in CI's conformance run (``coverage=
#: "pairs"``): a unit applied again needs a commit run again after it (the driver killed
#: after committing); a unit left staged needs a task attempt's unit rolled back (the
#: task killed after its prepare); a dropped partition shows in every batch.
SHOWN_AT = {
    "partition": ("after-prepare",),
    "replay": ("after-commit",),
    "prepare": ("after-prepare",),
    "rollback": ("after-prepare",),
    "overwrite": ("after-prepare",),
}

_PATHS: dict[str, str] = {}


def _reader(kind: str) -> Callable[[], dict[str, int]]:
    return lambda: counts(_PATHS[kind], "counts")


def _leftovers(kind: str) -> Callable[[], list[str]]:
    return lambda: in_doubt(_PATHS[kind])


for _kind in BROKEN:  # module:function references the harness imports
    globals()[f"read_{_kind}"] = _reader(_kind)
    globals()[f"leftovers_{_kind}"] = _leftovers(_kind)


def broken_sinks(work: Path, kinds: tuple[str, ...]) -> tuple[CustomSink, ...]:
    """A custom sink per kind, each writing its own SQLite file under ``work``."""
    customs = []
    for kind in kinds:
        _PATHS[kind] = str(work / f"broken-{kind}.db")
        options = (("path", _PATHS[kind]), ("table", "counts"), ("keyColumn", "word"),
                   ("valueColumn", "count"), ("mode", "add"), ("breaks", kind))  # fmt: skip
        customs.append(
            CustomSink(
                "eos_sqlite_broken",
                f"{__name__}:read_{kind}",
                options,
                "examples.sqlite_sink.broken:BrokenSqliteDataSource",
                name=kind,
                columns=("word", "delta AS count"),
                leftovers=f"{__name__}:leftovers_{kind}",
                points=SHOWN_AT[kind],
            )
        )
    return tuple(customs)


def check_broken_sinks_were_reported(report: Report, kinds: tuple[str, ...]) -> None:
    """Each broken sink failed in the column of what it breaks."""
    results = {
        r.sink.removeprefix("rc-custom-"): r
        for r in report.sinks
        if r.sink.removeprefix("rc-custom-") in kinds
    }
    assert set(results) == set(kinds), sorted(results)
    for kind in kinds:
        column = EXPECTED[kind]
        result = results[kind]
        shown = len(result.leftovers) if column == "leftovers" else getattr(result, column)
        assert shown > 0, f"the sink that breaks {kind!r} was not reported {column}: {result}"
        assert not result.ok
    assert not report.ok
