"""The harness, shown to fail, with every broken sink (``examples.sqlite_sink.broken``) in a
run of their own: each must be reported in the column of what it breaks. CI runs one per
column inside the conformance run (tests/system/test_conformance.py); this is `make soak`'s.

Cost: ~120 s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from eos_connectors.dev.harness.report import Report
from examples.sqlite_sink.broken import BROKEN
from tests.system.broken_sinks import broken_sinks, check_broken_sinks_were_reported


@pytest.mark.soak
@pytest.mark.cost(120)
def test_verify_reports_each_broken_sink_in_the_column_of_what_it_breaks(
    eos_verify: Callable[..., Report], tmp_path: Path
) -> None:
    kinds = tuple(BROKEN)
    report = eos_verify(
        records=1_500,
        sinks=(),
        customs=broken_sinks(tmp_path, kinds),
        kills=0,
        full_crashes="none",
    )
    print(report.table(), report.fault_table(), sep="\n")
    assert not report.problems, report.problems
    assert set(report.fired) == set(report.plan["schedule"]), "a planned fault point never fired"
    check_broken_sinks_were_reported(report, kinds)
