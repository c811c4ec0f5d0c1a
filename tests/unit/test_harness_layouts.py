"""The crossing layouts of the harness: what a run's refusals must show (issue 52)."""

from __future__ import annotations

from eos_connectors.dev.harness.layouts import LAYOUTS, refusal_problems
from eos_connectors.dev.harness.spec import QuerySpec

QUERY = QuerySpec("cl-postgres-changes", "in", "changes", "eos_postgres", (), layouts=LAYOUTS)
MESSAGE = (
    "Key 'w00003' reached two tasks of batch 0 of sink 's' (partitions 0 and 2 of the "
    "sink's input), ... .repartition('word') just before the sink."
)


def _refusal(
    layout: str, held: int = 0, committed: int = 0, message: str = MESSAGE
) -> dict[str, object]:
    return {
        "query": QUERY.name,
        "layout": layout,
        "held": held,
        "committed": committed,
        "message": message,
    }


def test_each_crossing_layout_refused_with_nothing_written_is_no_problem() -> None:
    refusals = [_refusal("split"), _refusal("round-robin")]
    assert refusal_problems([QUERY], refusals) == []


def test_a_layout_never_refused_a_refused_fix_and_rows_left_are_problems() -> None:
    problems = refusal_problems(
        [QUERY], [_refusal("split", held=7), _refusal("by-key"), _refusal("split", message="x")]
    )
    assert any("never refused in layout 'round-robin'" in p for p in problems), problems
    assert any("held 7 rows" in p for p in problems), problems
    assert any("fixed layout" in p for p in problems), problems
    assert any("names no key" in p for p in problems), problems


def test_a_refusal_after_committed_batches_may_find_their_rows() -> None:
    refusals = [_refusal("split", held=40, committed=3), _refusal("round-robin")]
    assert refusal_problems([QUERY], refusals) == []
