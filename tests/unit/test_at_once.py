"""Two steps at once: the driver's start checks beside its claim, a Kafka sink task's
marker read beside its decision pointer's."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from eos_connectors.core.at_once import at_once


def test_two_steps_run_at_once_and_the_first_steps_error_wins() -> None:
    both = threading.Barrier(2, timeout=5)  # neither passes unless the other runs meanwhile

    def step(answer: str) -> Callable[[], str]:
        def run() -> str:
            both.wait()
            return answer

        return run

    assert at_once(step("checked"), step("claimed")) == ("checked", "claimed")

    def fails(what: str) -> Callable[[], None]:
        def run() -> None:
            raise RuntimeError(what)

        return run

    with pytest.raises(RuntimeError, match="broker unreachable"):
        at_once(fails("broker unreachable"), fails("claim failed"))
    with pytest.raises(RuntimeError, match="claim failed"):
        at_once(lambda: None, fails("claim failed"))
