"""Statistics over plain numbers, without numpy: this runs in the pytest process and in reports."""

from __future__ import annotations

import math
from typing import Sequence


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks: Hyndman and Fan (1996), "Sample quantiles in statistical
    packages", Am. Stat. 50:361-365, definition 7 (numpy's and R's default)."""
    if not xs:
        raise ValueError("quantile of no samples")
    s = sorted(xs)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def relative_spread(values: Sequence[float]) -> float | None:
    """Standard deviation of log(values): the run-to-run variation, symmetric for slow and fast outliers; None for
    fewer than 2 values or a non-positive one."""
    if len(values) < 2 or any(v <= 0 for v in values):
        return None
    logs = [math.log(v) for v in values]
    mean = math.fsum(logs) / len(logs)
    return math.sqrt(math.fsum((x - mean) ** 2 for x in logs) / (len(logs) - 1))


def max_relative_difference(a: Sequence[float], b: Sequence[float]) -> float:
    """Largest |a_i - b_i| / |b_i| over two loss curves of the same length (b the reference); NaN or inf where
    either curve is not finite somewhere (never "within" a limit: the curves are not comparable)."""
    if len(a) != len(b):
        raise ValueError(f"loss curves differ in length ({len(a)} vs {len(b)})")
    diffs = [abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b)]
    # max() keeps its first element against a later NaN (every comparison with NaN is false): look for one first
    return math.nan if any(math.isnan(d) for d in diffs) else max(diffs, default=0.0)


def first_non_finite(xs: Sequence[float]) -> int | None:
    """The index of the first NaN or infinite value (None: all finite)."""
    return next((i for i, x in enumerate(xs) if not math.isfinite(x)), None)
