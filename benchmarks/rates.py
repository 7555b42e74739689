"""The uncertainty of a rate a benchmark measured (false alarms, catches) over a number of decisions."""

from __future__ import annotations

import math


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
