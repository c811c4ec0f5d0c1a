"""Test tiers and what each test costs (a pytest plugin, loaded by tests/conftest.py).

Tiers are folders, by what a test needs:

* ``tests/unit``: nothing but Python;
* ``tests/services``: the real Kafka, PostgreSQL and Redis, no Spark;
* ``tests/spark``: the services and the session's one local Spark;
* ``tests/system``: whole pipelines as processes of their own (the harness, clusters).

Each test gets its folder's marker (``-m unit`` selects the unit tier). A test of more
than a few seconds says what it costs with ``@pytest.mark.cost(seconds)`` (measured on
this project's 2-core CI machine); one without a mark counts its tier's default. When
the selection is made, the session prints the selected tests' expected total against
the CI budget, and at its end writes ``test-results/durations*.md``: the slowest tests,
each with its mark beside what it took (pytest's JUnit XML, ``--junitxml``, keeps every
test's time). ``make full`` adds the second tier (``@pytest.mark.full``): tests that can
neither lose nor duplicate a record nor leak a secret (the wheel, parity with Spark's
JVM connector, the stack's lifecycle, the benchmarks' probes).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIERS = ("unit", "services", "spark", "system")
#: Seconds a test without a cost mark is expected to take, by tier.
DEFAULT_COST = {"unit": 0.05, "services": 0.5, "spark": 1.5, "system": 30.0, "": 0.5}
#: What the tests' own time (their costs, summed as if one ran after another) may come
#: to in CI. ``make test`` runs the services and Spark tiers on two workers and the
#: rest one test at a time (scripts/test.sh), so 15 minutes for all of ``.ci/run``,
#: less installing, linting and starting the services, holds more than that.
PYTEST_BUDGET_SECONDS = 840
RESULTS = ROOT / "test-results"
SLOWEST = 25

_took: dict[str, float] = {}
_marks: dict[str, float] = {}


def tier(item: pytest.Item) -> str:
    parts = Path(str(item.path)).relative_to(ROOT).parts
    return parts[1] if len(parts) > 2 and parts[0] == "tests" and parts[1] in TIERS else ""


def cost(item: pytest.Item) -> float:
    """The test's cost mark, else its tier's default."""
    mark = item.get_closest_marker("cost")
    return float(mark.args[0]) if mark is not None else DEFAULT_COST[tier(item)]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "cost(seconds): what the test takes on the 2-core CI machine, in seconds"
    )
    for name in TIERS:
        config.addinivalue_line("markers", f"{name}: a test of the tests/{name} tier")


#: On pytest-xdist's workers, tests marked this costly or more run first.
FIRST_COST = 30.0


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test gets its tier's marker. On xdist's workers (the services and Spark tiers of
    ``make test``) a test that takes half a minute or more is handed out first, so that
    no worker picks it up near the end while the other idles (one 50 s test handed out
    last left the workers 232 s and 189 s busy). Only those: with every test of 8 s or
    more first, the Spark-heavy tests ran at once on both workers and the tier took
    298 s instead of 243-270 s (2 cores). Every worker sorts its collection alike, as
    xdist requires; no fixture here is module-scoped, so moving a test costs no set-up."""
    for item in items:
        if tier(item):
            item.add_marker(tier(item))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        first = sorted((i for i in items if _first(i)), key=cost, reverse=True)
        hdfs = [i for i in items if _on_hdfs(i)]
        rest = [i for i in items if not _first(i) and not _on_hdfs(i)]
        middle = len(rest) // 2
        items[:] = first + rest[:middle] + hdfs + rest[middle:]


def _on_hdfs(item: pytest.Item) -> bool:
    """On HDFS, or on the other PySpark release's virtualenv: what scripts/test.sh starts
    or builds beside the first tests."""
    return any(item.get_closest_marker(m) is not None for m in ("hdfs", "other_release"))


def _first(item: pytest.Item) -> bool:
    """Handed out first: costly. Tests on HDFS are handed out midway instead, whatever
    their cost: scripts/test.sh starts HDFS only once the services are up (handed out
    first, the HDFS savepoint test idled 33 s in its set-up), and in collection order
    (test_savepoints.py comes late) it ran last, 73 s with the other worker idle."""
    return cost(item) >= FIRST_COST and not _on_hdfs(item)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not session.items:
        return
    by_tier: dict[str, float] = {}
    for item in session.items:
        by_tier[tier(item) or "other"] = by_tier.get(tier(item) or "other", 0.0) + cost(item)
    total = sum(by_tier.values())
    parts = ", ".join(f"{name} {seconds:.0f} s" for name, seconds in sorted(by_tier.items()))
    verdict = "within" if total <= PYTEST_BUDGET_SECONDS else "OVER"
    line = (
        f"expected cost of the {len(session.items)} selected tests: {total:.0f} s ({parts}); "
        f"{verdict} CI's pytest budget of {PYTEST_BUDGET_SECONDS} s"
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Any:
    """The test's cost mark travels with its report (to pytest-xdist's controller too)."""
    outcome = yield
    report = outcome.get_result()
    mark = item.get_closest_marker("cost")
    if mark is not None and report.when == "call":
        report.user_properties.append(("cost", float(mark.args[0])))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Setup, call and teardown together: what the test took."""
    _took[report.nodeid] = _took.get(report.nodeid, 0.0) + report.duration
    for key, value in report.user_properties:
        if key == "cost":
            _marks[report.nodeid] = float(str(value))


def pytest_sessionfinish(session: pytest.Session) -> None:
    """``test-results/durations.md``: the slowest tests, their marks and what they took
    (``durations-<name>.md`` beside a ``--junitxml`` of ``junit-<name>.xml``); written by
    pytest-xdist's controller, never by its workers."""
    if not _took or hasattr(session.config, "workerinput"):
        return
    junit = Path(str(session.config.getoption("xmlpath", None) or "junit.xml"))
    name = junit.stem.replace("junit", "durations", 1) if junit.stem.startswith("junit") else ""
    rows = sorted(_took.items(), key=lambda pair: -pair[1])[:SLOWEST]
    lines = [
        f"# The {len(rows)} slowest of {len(_took)} tests: {sum(_took.values()):.0f} s in all",
        "",
        "| took (s) | cost mark (s) | test |",
        "| --: | --: | --- |",
    ]
    for nodeid, took in rows:
        marked = f"{_marks[nodeid]:.0f}" if nodeid in _marks else "-"
        lines.append(f"| {took:.1f} | {marked} | `{nodeid}` |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name or 'durations'}.md").write_text("\n".join(lines) + "\n")
