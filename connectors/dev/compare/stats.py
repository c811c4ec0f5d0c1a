"""A paired ratio and its 95% interval: how sure one run is that A is x times B.

Two pipelines that ran in the same rounds give one ratio per round. The ratio's
estimate is their geometric mean, and its interval a Student t-interval on the
logarithms (a ratio's noise is multiplicative: 0.9x and 1.1x are not symmetric
around 1.0x, their logarithms are).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: Student's t, two-sided 95% (0.975 quantile), by degrees of freedom; 1.96 past 30.
_T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def t975(degrees: int) -> float:
    if degrees < 1:
        raise ValueError("a t-interval needs two samples or more")
    return _T975[degrees - 1] if degrees <= len(_T975) else 1.96


@dataclass(frozen=True)
class Ratio:
    """``estimate`` (geometric mean of ``ratios``) with its 95% interval; an interval
    only from two ratios on."""

    ratios: tuple[float, ...]
    estimate: float
    low: float | None = None
    high: float | None = None

    @property
    def half_width(self) -> float | None:
        """The interval's larger side, as a share of the estimate (0.03: +-3%)."""
        if self.low is None or self.high is None:
            return None
        return max(self.high / self.estimate - 1, 1 - self.low / self.estimate)

    def narrower_than(self, share: float) -> bool:
        width = self.half_width
        return width is not None and width < share

    def straddles(self, bound: float) -> bool:
        return self.low is not None and self.high is not None and self.low < bound < self.high

    def text(self, digits: int = 2) -> str:
        """``1.21x [1.15, 1.27] (6 rounds)``; a single ratio as ``1.21x (1 round)``."""
        rounds = f"{len(self.ratios)} round{'s' if len(self.ratios) != 1 else ''}"
        if self.low is None or self.high is None:
            return f"{self.estimate:.{digits}f}x ({rounds})"
        return (
            f"{self.estimate:.{digits}f}x [{self.low:.{digits}f}, {self.high:.{digits}f}] "
            f"({rounds})"
        )


def paired(mine: Sequence[float | None], other: Sequence[float | None]) -> Ratio | None:
    """The ratio of ``mine`` to ``other``, round by round (a round where either has no
    figure, or a zero, is left out); None when no round has both."""
    ratios = tuple(a / b for a, b in zip(mine, other, strict=False) if a and b)
    if not ratios:
        return None
    logs = [math.log(r) for r in ratios]
    centre = statistics.fmean(logs)
    if len(logs) < 2:
        return Ratio(ratios, math.exp(centre))
    half = t975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return Ratio(ratios, math.exp(centre), math.exp(centre - half), math.exp(centre + half))


def spread(values: Sequence[float | None]) -> tuple[float, float, float] | None:
    """(median, lowest, highest) of the figures present; None when there are none."""
    present = [v for v in values if v is not None]
    if not present:
        return None
    return statistics.median(present), min(present), max(present)
