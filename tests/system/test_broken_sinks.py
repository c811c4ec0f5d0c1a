"""The harness, shown to fail: ``eos verify`` crashes a real pipeline into five sinks
that each break the protocol in one way (``examples.sqlite_sink.broken``), and must
report each in the column of what it breaks (CI runs one per column: lost, duplicated,
leftovers; ``make soak`` all five).

They run in one harness run, one query each (``rc-custom-<kind>``), every fault
point of each crossed as for any sink. Each adds up every batch's change per word
(``mode=add`` of the running count's ``delta``), where a loss or a duplicate shows.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from eos_connectors.dev.harness.cells import CustomSink
from eos_connectors.dev.harness.report import Report
from examples.sqlite_sink import counts
from examples.sqlite_sink.broken import BROKEN, in_doubt

_PATHS: dict[str, str] = {}

#: What the report must show for each broken sink.
EXPECTED = {
    "partition": "lost",
    "replay": "duplicated",
    "prepare": "duplicated",
    "rollback": "leftovers",
    "overwrite": "lost",
}


def _reader(kind: str) -> Callable[[], dict[str, int]]:
    return lambda: counts(_PATHS[kind], "counts")


def _leftovers(kind: str) -> Callable[[], list[str]]:
    return lambda: in_doubt(_PATHS[kind])


for _kind in BROKEN:  # module:function references the harness imports
    globals()[f"read_{_kind}"] = _reader(_kind)
    globals()[f"leftovers_{_kind}"] = _leftovers(_kind)


@pytest.mark.parametrize(
    "kinds",
    [
        # one sink per column of the report in CI (its budget), every one in make soak
        pytest.param(("partition", "replay", "rollback"), id="each-column"),
        pytest.param(tuple(BROKEN), id="all", marks=pytest.mark.soak),
    ],
)
def test_verify_reports_each_broken_sink_in_the_column_of_what_it_breaks(
    eos_verify: Callable[..., Report], tmp_path: Path, kinds: tuple[str, ...]
) -> None:
    customs = []
    for kind in kinds:
        _PATHS[kind] = str(tmp_path / f"{kind}.db")
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
            )
        )
    report = eos_verify(
        records=1_500, sinks=(), customs=tuple(customs), kills=0, full_crashes="none"
    )
    print(report.table(), report.fault_table(), sep="\n")
    assert not report.problems, report.problems
    assert set(report.fired) == set(report.plan["schedule"]), "a planned fault point never fired"
    results = {r.sink.removeprefix("rc-custom-"): r for r in report.sinks}
    assert set(results) == set(kinds)
    for kind in kinds:
        column = EXPECTED[kind]
        result = results[kind]
        shown = len(result.leftovers) if column == "leftovers" else getattr(result, column)
        assert shown > 0, f"the sink that breaks {kind!r} was not reported {column}: {result}"
        assert not result.ok
    assert not report.ok
