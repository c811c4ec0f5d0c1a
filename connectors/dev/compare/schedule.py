"""The rounds of a comparison: which pipelines run in each, in what order, and when to stop.

* Rounds 1 to ``rounds``: every pipeline, both phases (all throughput phases of the
  round, then all latency and recovery phases, in the same order). Quix and the
  raw loop, shown for reference, run only in the first ``reference_rounds``.
* A round runs :data:`pipelines.ORDER` forwards when odd and backwards when even
  (ABBA): the two pipelines of a pair run next to each other, and each runs first
  as often as second, so a drift of the machine cancels in their ratio.
* From there on, up to ``max_rounds``, only the throughput phase of the pairs
  whose records/s ratio is still known to worse than +-``precision`` (its 95%
  interval), until it is known well enough or the rounds run out (the report
  then says so, with the interval).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from eos_connectors.dev.compare import pipelines as pl
from eos_connectors.dev.compare import stats
from eos_connectors.dev.compare.runner import (
    Result,
    Round,
    Settings,
    latency_and_recovery,
    throughput,
)
from eos_connectors.dev.endpoints import Endpoints


def ordered(chosen: list[pl.Pipeline]) -> list[pl.Pipeline]:
    keys = {p.key for p in chosen}
    return [pl.BY_KEY[key] for key in pl.ORDER if key in keys]


def pair_ratio(results: dict[str, Result], mine: str, other: str) -> stats.Ratio | None:
    """``mine``'s steady records/s over ``other``'s, round by round."""
    if mine not in results or other not in results:
        return None
    return results[mine].ratio_to(results[other], lambda r: r.rate)


def uncertain_pairs(results: dict[str, Result], precision: float) -> list[tuple[str, str]]:
    """The pairs (both pipelines chosen and running) whose ratio's interval is still
    wider than +-``precision``."""
    live = {key for key, result in results.items() if not result.error}
    pending = []
    for mine, other in pl.PAIRS:
        if mine in live and other in live:
            ratio = pair_ratio(results, mine, other)
            if ratio is None or not ratio.narrower_than(precision):
                pending.append((mine, other))
    return pending


def due(
    number: int, order: list[pl.Pipeline], results: dict[str, Result], s: Settings
) -> list[pl.Pipeline]:
    """The pipelines round ``number`` runs, in the round's order."""
    live = [p for p in order if not results[p.key].error]
    if number <= s.rounds:
        chosen = [p for p in live if not p.reference or number <= s.reference_rounds]
    else:
        pending = {key for pair in uncertain_pairs(results, s.precision) for key in pair}
        chosen = [p for p in live if p.key in pending]
    return chosen if number % 2 else chosen[::-1]


def run_all(
    chosen: list[pl.Pipeline], topic: str, endpoints: Endpoints, s: Settings
) -> list[Result]:
    """Every chosen pipeline through its rounds; a pipeline that fails is reported with
    its error, not hidden, and runs no further round."""
    order = ordered(chosen)
    results = {p.key: Result(p) for p in order}
    for number in range(1, s.max_rounds + 1):
        running = due(number, order, results, s)
        if not running:
            break
        both = number <= s.rounds and s.latency_seconds > 0
        print(
            f"Round {number}: {', '.join(p.key for p in running)}"
            f"{'' if both else ' (throughput only)'}",
            flush=True,
        )
        figures = {p.key: Round(number) for p in running}
        for pipeline in running:
            print(f"  {pipeline.key}: throughput...", flush=True)
            run = partial(throughput, pipeline, topic, endpoints, s, figures[pipeline.key])
            if _phase(results[pipeline.key], run):
                print(f"  {pipeline.key}: {figures[pipeline.key].rate:,.0f} records/s", flush=True)
        timed = (p for p in running if both and not p.changes and not results[p.key].error)
        for pipeline in timed:
            print(f"  {pipeline.key}: latency, recovery...", flush=True)
            run = partial(latency_and_recovery, pipeline, endpoints, s, figures[pipeline.key])
            _phase(results[pipeline.key], run)
        for key, round_figures in figures.items():
            if not results[key].error:
                results[key].rounds.append(round_figures)
    return [results[p.key] for p in order]


def _phase(result: Result, phase: Callable[[], None]) -> bool:
    try:
        phase()
        return True
    except (RuntimeError, TimeoutError, AssertionError) as exc:
        print(f"  {result.pipeline.key}: FAILED: {exc}", flush=True)
        result.error = str(exc)
        return False
