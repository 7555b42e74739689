"""Statistics over plain numbers: quantiles, summaries, the run-to-run variation, loss differences.

No numpy/scipy: this runs in the pytest process and in reports. Intervals and verdicts live in the
decision core (decision.py); the quantities reports show in figures.py.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence


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


def summarize(xs: Sequence[float]) -> Summary:
    return Summary(n=len(xs), median=quantile(xs, 0.5), p10=quantile(xs, 0.1), p90=quantile(xs, 0.9),
                   iqr=quantile(xs, 0.75) - quantile(xs, 0.25), mean=statistics.fmean(xs))


def relative_spread(values: Sequence[float]) -> float | None:
    """Standard deviation of log(values): about the relative spread, symmetric for slow and fast outliers.
    The run-to-run variation every report and the decision core use; None for fewer than 2 values or a
    non-positive one."""
    if len(values) < 2 or any(v <= 0 for v in values):
        return None
    logs = [math.log(v) for v in values]
    mean = math.fsum(logs) / len(logs)
    return math.sqrt(math.fsum((x - mean) ** 2 for x in logs) / (len(logs) - 1))


def max_relative_difference(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"loss curves differ in length ({len(a)} vs {len(b)})")
    return max((abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)), default=0.0)


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a rate k/n (95 % at z = 1.96): what a benchmark's false-alarm or catch rate
    can be, given n decisions (Wilson, JASA 1927; Brown, Cai & DasGupta, Statist. Sci. 2001)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))
