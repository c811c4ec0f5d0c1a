"""Fetch and build once what the tests and the harness need, ahead of them (development
tooling): the Spark class archive (:mod:`eos_connectors.dev.warm_up`), Toxiproxy (the
network-fault proxy, built from the Go module proxy) and the HDFS and Kafka jars, the
broker's and then its tools' (one Maven at a time into the shared local repository;
from Maven Central), each cached per user.

Each is fetched the first time a test needs it anyway; ``make test`` runs this while
ruff and mypy run, so a fresh machine's downloads and builds overlap the lint instead
of adding to the tests' time. ``python -m eos_connectors.dev.prefetch
[early|archive|proxy|late]``:
exit 0 when everything is in place, 1 naming what failed (the tests then fail on it
clearly).

Four parts, because the first tests wait for the first: *early* is what every test of
the services and Spark tiers needs (Kafka's jars and tools); *archive* (Spark's class
archive, rebuilt for every clone's ``.venv``: ~60 s beside the lint and the services'
start) makes each Spark JVM start ~6 s sooner, and the first tests start without it
rather than wait (a Spark process started after it is built maps it; the harness waits
for a build under way);
*proxy* (Toxiproxy, built with Go) is what a few of them need, built beside the early
part and waited for by those tests only (they take its build lock); *late* is what only
the system tier needs (Hadoop's jars for HDFS, the other PySpark release's virtualenv),
at the lowest CPU priority. On a fresh 2-core machine the class archive, built beside
mypy, Maven and Toxiproxy's Go build, came last, 216 s in, and held the first tests until
then; Toxiproxy built at the lowest priority instead was not ready when a services test
needed it (it waited 75 s). Each step prints when it was ready.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def _steps(part: str) -> dict[str, Callable[[], Path | None]]:
    from eos_connectors.dev.stack import hdfs, kafka, kafka_tools, toxiproxy
    from eos_connectors.dev.warm_up import ensure_class_archive

    if part == "early":
        return {
            "Kafka's jars and tools": lambda: (kafka.ensure_jars(), kafka_tools.tools_jars())[1]
        }
    if part == "archive":
        return {"Spark's class archive": ensure_class_archive}
    if part == "proxy":
        return {"Toxiproxy": toxiproxy.ensure_binary}
    return {
        "Hadoop's jars": hdfs.ensure_jars,
        "the other PySpark release's virtualenv": _other_release,
    }


def _other_release() -> Path:
    """The virtualenv of the end of PySpark's range the ``.venv`` does not hold, for the
    system tier's reference cell (tests/system/test_spark_range.py): ~25 s of unpacking
    and up to two minutes of download on a fresh machine, beside the first tiers."""
    from eos_connectors.dev.release_venv import other_end, python_of

    return Path(python_of(other_end()))


PARTS = ("early", "archive", "proxy", "late")


def main(argv: list[str]) -> int:
    parts = argv or list(PARTS)
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        print(f"prefetch: unknown part(s) {unknown}: say {', '.join(PARTS)}", file=sys.stderr)
        return 2
    if parts == ["late"]:
        os.nice(19)  # after the early part and the tests, never before them
    steps = {name: step for part in parts for name, step in _steps(part).items()}
    failed = []
    began = time.monotonic()

    def timed(name: str, step: Callable[[], Path | None]) -> Path | None:
        done = step()
        print(f"prefetch: {name} ready after {time.monotonic() - began:.0f} s", flush=True)
        return done

    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {name: pool.submit(timed, name, step) for name, step in steps.items()}
    for name, future in futures.items():
        error = future.exception()
        if error is not None or future.result() is None:
            failed.append(f"{name}: {error or 'not built'}")
    for line in failed:
        print(f"prefetch: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
