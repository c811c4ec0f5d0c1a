"""Two independent steps that wait on servers, run at once (driver or task)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import TypeVar

A = TypeVar("A")
B = TypeVar("B")


def at_once(first: Callable[[], A], second: Callable[[], B]) -> tuple[A, B]:
    """Driver or task: run two steps at once, ``second`` on a thread of its own; their
    answers, once both have ended. Meant for independent steps that wait on servers, not
    on the CPU: never for a step that needs what the other one checks or creates (the
    Kafka sink's claim needs the topics its start checks find). When both fail,
    ``first``'s error is raised: put the check whose error says more first."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="eos-at-once") as pool:
        later = pool.submit(second)
        try:
            answer = first()
        finally:
            wait([later])
    return answer, later.result()
