"""The batch commit's kept marker groups (sinks/kafka/pool.py): a task partition's group
is made once per Python worker and lent to each of its tasks; a task that failed
closes it instead of handing it on. No broker: consumers connect at their first call.
Cost: <1 s."""

from __future__ import annotations

import pytest

from eos_connectors.sinks.kafka.options import parse_options
from eos_connectors.sinks.kafka.pool import MarkerGroups

OPTIONS = parse_options({"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "t"})


def test_a_group_is_lent_again_after_a_task_and_dropped_after_a_failure() -> None:
    groups = MarkerGroups(size=2)
    with groups.lent(OPTIONS, "eos-s-0") as first:
        pass
    with groups.lent(OPTIONS, "eos-s-0") as again:
        assert again is first
    with pytest.raises(RuntimeError), groups.lent(OPTIONS, "eos-s-0") as failed:
        raise RuntimeError("the task failed")
    with groups.lent(OPTIONS, "eos-s-0") as fresh:
        assert fresh is not failed
    assert groups.created == 2


def test_other_settings_or_groups_get_their_own_and_the_oldest_idle_one_goes() -> None:
    groups = MarkerGroups(size=2)
    other = parse_options({"kafka.bootstrap.servers": "127.0.0.1:2", "topic": "t"})
    for options, group in ((OPTIONS, "a"), (other, "a"), (OPTIONS, "b"), (OPTIONS, "c")):
        with groups.lent(options, group):
            pass
    assert groups.created == 4
    with groups.lent(OPTIONS, "a"):  # the least recently used: closed
        pass
    assert groups.created == 5
