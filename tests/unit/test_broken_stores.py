"""The contract kit, shown to fail: run against each deliberately broken store
(``eos_connectors.testing.broken``), it must fail, and say what broke."""

from __future__ import annotations

import pytest

from eos_connectors.testing.broken import BROKEN_STORES

MODULE = """
import uuid
from eos_connectors.testing import SinkContract, memory_server
from eos_connectors.testing.broken import {cls}


class TestBroken(SinkContract):
    def setup_method(self):
        self.server = f"broken-{{uuid.uuid4().hex}}"

    def new_writer(self, sink_id=None):
        return {cls}(self.server, sink_id)

    def visible(self):
        return memory_server(self.server).data
"""

#: What the kit must say about each broken store (in some failing test's output).
SAYS = {
    "drops a partition": r"[1-9]\d* lost",
    "commits a replay twice": r"[1-9]\d* written twice",
    "commits before the decision": r"[1-9]\d* written twice",
    "leaves units behind": r"units left in doubt: eos\|",
    "lets a count go back": r"[1-9]\d* lost",
}


@pytest.mark.parametrize("broken", sorted(BROKEN_STORES))
def test_the_kit_fails_on_a_broken_store(pytester: pytest.Pytester, broken: str) -> None:
    pytester.makepyfile(test_broken=MODULE.format(cls=BROKEN_STORES[broken].__name__))
    result = pytester.runpytest_inprocess("-q", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) >= 1, f"the kit passed a store that {broken}"
    result.stdout.re_match_lines([f".*{SAYS[broken]}.*"], consecutive=False)
