"""The event-time cell's expectation comes from the input alone, whatever the batches.

A model of Spark's windowed count in append mode (the rules the real query follows in
the conformance run) is run over the harness's timed input cut into batches in many
ways; each cut must emit exactly what ``window_counts`` expects from the input alone.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from collections import Counter

import pytest

from eos_connectors.core.errors import EosError
from eos_connectors.core.topics import Record
from eos_connectors.dev.harness.cells import late_records, window_counts
from eos_connectors.dev.harness.data import transactions
from eos_connectors.dev.harness.spec import WATERMARK_SECONDS, WINDOW_SECONDS

BATCH = 400  # the most offsets a batch reads


def committed_records(batch: int = BATCH, records: int = 6_000) -> tuple[list[Record], int]:
    """The timed input as one partition of a broker holds it: aborted records and each
    transaction's marker take offsets; returns the committed records and the end offset."""
    found: list[Record] = []
    offset = 0
    for pairs, commits in transactions(records, seed=3, timed=batch):
        for word, stamp in pairs:
            if commits:
                found.append(Record(0, offset, word.encode(), word.encode(), stamp))
            offset += 1
        offset += 1  # the commit or abort marker
    return found, offset


def spark_emits(records: list[Record], cuts: list[int]) -> Counter[str]:
    """What Spark's windowed count writes when the batches end at ``cuts`` (offsets):
    batch N drops a row whose window ended at the watermark of batch N-1, and emits the
    windows that ended at its own watermark, the newest event time of the batches before
    it less the delay. No batch without data runs after the last (availableNow)."""
    delay = WATERMARK_SECONDS * 1000
    state: Counter[str] = Counter()
    emitted: Counter[str] = Counter()
    watermark = previous_watermark = newest = 0
    offsets = [r.offset for r in records]  # in offset order
    start = 0
    for end in cuts:
        rows = records[bisect_left(offsets, start) : bisect_left(offsets, end)]
        for row in rows:
            window = row.timestamp // 1000 // WINDOW_SECONDS * WINDOW_SECONDS
            if (window + WINDOW_SECONDS) * 1000 > previous_watermark:
                state[f"{row.key.decode() if row.key else ''}@{window}"] += 1
        for key in [
            k for k in state if (int(k.rsplit("@", 1)[1]) + WINDOW_SECONDS) * 1000 <= watermark
        ]:
            emitted[key] = state.pop(key)
        newest = max([newest, *(r.timestamp for r in rows)])
        previous_watermark, watermark = watermark, max(watermark, newest - delay)
        start = end
    return emitted


def random_cuts(end: int, rng: random.Random, smallest: int) -> list[int]:
    cuts, at = [], 0
    while at < end:
        at = min(end, at + rng.randint(smallest, BATCH))
        cuts.append(at)
    return cuts


@pytest.mark.parametrize("smallest", [BATCH, BATCH // 2, 1])
def test_every_cut_of_the_timed_input_emits_what_the_input_alone_says(smallest: int) -> None:
    records, end = committed_records()
    expected = window_counts(records, BATCH)
    assert late_records(records, BATCH) > 20  # the input has late records, all dropped
    rng = random.Random(smallest)
    for _ in range(20):
        assert spark_emits(records, random_cuts(end, rng, smallest)) == expected


def test_a_source_that_stops_short_fails_the_expectation() -> None:
    # It never reads its last batch of words, nor the tail after them. (Records of the
    # tail alone are not seen in any window: a source that stops inside the tail passes
    # this cell; the records cell counts every record.)
    records, end = committed_records()
    expected = window_counts(records, BATCH)
    newest = max(r.timestamp for r in records)
    tail = min(r.offset for r in records if r.timestamp == newest)
    short = [r for r in records if r.offset < tail - BATCH]
    assert spark_emits(short, random_cuts(end, random.Random(1), BATCH)) != expected


def test_input_whose_lateness_depends_on_the_batches_is_refused() -> None:
    # Input stamped for batches of 100 offsets, read 1,000 a batch: a late record's
    # window closed less than two batches before it.
    records, _end = committed_records(batch=100)
    with pytest.raises(EosError, match="depending on where the batches"):
        window_counts(records, 1_000)


def test_input_without_a_tail_longer_than_a_batch_is_refused() -> None:
    records, _end = committed_records()
    newest = max(r.timestamp for r in records)
    cut = [r for r in records if r.timestamp < newest]
    with pytest.raises(EosError, match="tail of more than"):
        window_counts(cut + [r for r in records if r.timestamp == newest][: BATCH // 2], BATCH)
