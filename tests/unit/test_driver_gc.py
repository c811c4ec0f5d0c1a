"""What :func:`eos_connectors.core.driver_gc.settle` freezes, call by call, in a process
Spark started and in one it did not. Each case runs in a Python process of its own (a
freeze would last for the rest of the test run's process). Cost: ~0.2 s (two processes)."""

from __future__ import annotations

import json
import subprocess
import sys

from eos_connectors.core.driver_gc import REFREEZE

_CALLS = """
import gc, json
from eos_connectors.core import driver_gc
counts = []
for call in range({calls}):
    driver_gc.settle()
    counts.append(gc.get_freeze_count())
    gc.collect()  # as PySpark's daemon does after every call
print(json.dumps(counts))
"""


def _frozen_after_each_call(calls: int, spark_started: bool) -> list[int]:
    env = {"PATH": "/usr/bin:/bin"}
    if spark_started:
        env["PYTHON_WORKER_FACTORY_SECRET"] = "set by Spark"  # what settle() looks for
    done = subprocess.run(
        [sys.executable, "-c", _CALLS.format(calls=calls)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    counts: list[int] = json.loads(done.stdout)
    return counts


def test_a_spark_process_freezes_from_its_second_call_and_thaws_once_in_a_while() -> None:
    counts = _frozen_after_each_call(REFREEZE + 2, spark_started=True)
    assert counts[0] == 0  # the first call's garbage is collected first
    assert counts[1] > 10_000  # the imports, frozen at the second call
    assert counts[1 : REFREEZE - 1] == [counts[1]] * (REFREEZE - 2)  # nothing more
    assert counts[REFREEZE - 1] == 0  # thawed: the collection after it walks everything
    # Frozen again at the next call: what lives then, less any cycle the frozen objects
    # left since the second call, which the thawed collection freed (its purpose).
    assert counts[1] - 100 <= counts[REFREEZE] <= counts[1] + 100


def test_a_process_spark_did_not_start_freezes_nothing() -> None:
    assert _frozen_after_each_call(3, spark_started=False) == [0, 0, 0]
