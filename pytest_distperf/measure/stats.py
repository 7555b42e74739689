"""Statistics over plain numbers: summaries of step times and the ratio of two strategies.

No numpy/scipy: this runs in the pytest process and in reports.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

# Two-sided 95 % Student t quantiles by degrees of freedom (1..30); 1.96 beyond.
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def t95(df: int) -> float:
    return _T95[df - 1] if 1 <= df <= len(_T95) else 1.96


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    if not xs:
        raise ValueError("quantile of no samples")
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    p10: float
    p90: float
    iqr: float
    mean: float

    @property
    def rel_iqr(self) -> float:
        return self.iqr / self.median if self.median else 0.0


def summarize(xs: Sequence[float]) -> Summary:
    return Summary(n=len(xs), median=quantile(xs, 0.5), p10=quantile(xs, 0.1), p90=quantile(xs, 0.9),
                   iqr=quantile(xs, 0.75) - quantile(xs, 0.25), mean=statistics.fmean(xs))


@dataclass(frozen=True)
class RatioEstimate:
    """A/B as the geometric mean of paired per-repeat ratios, with a 95 % interval (None for 1 pair)."""

    ratio: float
    low: float | None
    high: float | None
    pairs: int

    def interval_text(self) -> str:
        if self.low is None or self.high is None:
            return "n/a (1 repeat)"
        return f"[{self.low:.3f}, {self.high:.3f}]"


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> RatioEstimate:
    """Ratio of A to B from paired (interleaved) runs: a t-interval on the log ratios.

    Pairing cancels drift that hits both sides of an interleaved pair alike.
    """
    if len(a) != len(b) or not a:
        raise ValueError(f"paired_ratio needs equal, non-empty samples (got {len(a)} and {len(b)})")
    if any(x <= 0 for x in (*a, *b)):
        raise ValueError("paired_ratio needs positive values")
    logs = [math.log(x / y) for x, y in zip(a, b)]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return RatioEstimate(math.exp(mean), None, None, len(logs))
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return RatioEstimate(math.exp(mean), math.exp(mean - half), math.exp(mean + half), len(logs))


def relative_spread(values: Sequence[float]) -> float | None:
    """Standard deviation of log(values): about the relative spread, symmetric for slow and fast outliers.
    The gate's run-to-run variation (T = max(5 %, k x this)); None for fewer than 2 values or a non-positive one."""
    if len(values) < 2 or any(v <= 0 for v in values):
        return None
    return statistics.stdev(math.log(v) for v in values)


def max_relative_difference(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"loss curves differ in length ({len(a)} vs {len(b)})")
    return max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=0.0)
