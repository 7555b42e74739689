"""The group-sequential boundaries of the decision core: the planned looks, the error spent at each and the
Student's t quantiles they need (no scipy).

- Looks: the test's repeats, then doubled pair counts up to the budget (`planned_looks`). An estimate at n pairs,
  n_k <= n < n_(k+1), is look k's, over the first n_k pairs: however often a quantity is looked at, only the K
  planned tests are made on it. Few looks leave an early look able to decide (Jennison and Turnbull 2000, ch. 2).
- Spending: Lan and DeMets (1983), Biometrika 70:659-663: alpha(t) = alpha ln(1 + (e - 1) t), t the information
  fraction, the continuous form of Pocock (1977): it gives the first look enough error to decide a clear effect
  at 3 pairs.
- Look k gets the one-sided level alpha(t_k) - alpha(t_(k-1)) with its own variance estimate; by Bonferroni all K
  intervals hold the ratio with probability >= 98 %, whatever the correlation of the looks.
"""

from __future__ import annotations

import math
import statistics
from functools import lru_cache

FIRST_LOOK = 3  # the default repeats: the fewest pairs whose interval can be narrow (2 pairs leave 1 df)

_NORMAL = statistics.NormalDist()


def normal_upper(z: float) -> float:
    """P(Z > z), accurate far in the tail."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def normal_upper_inv(p: float) -> float:
    """z with P(Z > z) = p."""
    return -_NORMAL.inv_cdf(p)


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""

    def away_from_zero(v: float) -> float:
        return v if abs(v) > 1e-300 else 1e-300

    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 / away_from_zero(1.0 - qab * x / qap)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 / away_from_zero(1.0 + aa * d)
            c = away_from_zero(1.0 + aa / c)
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _beta_inc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_cf(a, b, x) / a
    return 1.0 - front * _beta_cf(b, a, 1.0 - x) / b


def t_upper(t: float, df: float) -> float:
    """P(T > t) for Student's t with df (real, > 0) degrees of freedom."""
    if df > 1e7:
        return normal_upper(t)
    tail = 0.5 * _beta_inc(df / 2.0, 0.5, df / (df + t * t))
    return tail if t >= 0 else 1.0 - tail


@lru_cache(maxsize=4096)
def t_upper_inv(p: float, df: float) -> float:
    """t with P(T > t) = p (0 < p < 0.5)."""
    if not 0.0 < p < 0.5:
        raise ValueError(f"upper tail probability must be in (0, 0.5), got {p!r}")
    if df > 1e7:
        return normal_upper_inv(p)
    if df == 1.0:
        return math.tan(math.pi * (0.5 - p))
    lo, hi = math.log(1e-9), math.log(1e15)  # bisection on log t: the tail is monotone in t
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_upper(math.exp(mid), df) > p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return math.exp(0.5 * (lo + hi))


def spent_pocock(t: float, alpha: float) -> float:
    """Lan-DeMets Pocock-type spending alpha ln(1 + (e - 1) t): the design's spending function."""
    return alpha * math.log1p((math.e - 1.0) * min(1.0, max(0.0, t)))


def planned_looks(max_pairs: int, first: int = FIRST_LOOK) -> tuple[int, ...]:
    """The pair (or candidate run) counts the design looks at: `first`, then doubling, the last at `max_pairs`; a
    doubling that would leave less than half a step before it goes to it (3 6 12; 3 6 8; 3 6 13; 2 4 8 12)."""
    n = min(max(2, first), max_pairs)
    looks = [n]
    while n < max_pairs:
        nxt = 2 * n
        if nxt >= max_pairs or max_pairs - nxt < (n + 1) // 2:
            nxt = max_pairs
        looks.append(nxt)
        n = nxt
    return tuple(looks)


def information(method: str, n: int, n_reference: int = 0) -> float:
    """Statistical information of n pairs (n), or of n candidate runs against m stored ones (1/(1/m + 1/n))."""
    if method == "paired" or n_reference <= 0:
        return float(n)
    return 1.0 / (1.0 / n_reference + 1.0 / n)


@lru_cache(maxsize=4096)
def look_levels(method: str, looks: tuple[int, ...], alpha: float, n_reference: int = 0) -> tuple[float, ...]:
    """One side's nominal level at each planned look: the spending increment at its information fraction (they
    sum to `alpha`: Bonferroni over the looks)."""
    full = information(method, looks[-1], n_reference)
    out, prev = [], 0.0
    for n in looks:
        now = spent_pocock(information(method, n, n_reference) / full, alpha)
        out.append(max(0.0, now - prev))
        prev = now
    return tuple(out)

