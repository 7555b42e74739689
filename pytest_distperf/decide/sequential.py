"""The group-sequential boundaries of the decision core (decide/decision.py): the planned looks, the error
spent at each (Lan-DeMets Pocock-type spending) and the Student's t quantiles they need (no scipy).

- Looks: the first look n_1 (the test's repeats), then doubled pair counts up to the budget N
  (`planned_looks`: 3 -> 6 -> 12 for N = 12). An estimate taken at n pairs, n_k <= n < n_(k+1), is the one of
  look k, over the first n_k pairs: however often, and by however many tests, a quantity is looked at, only
  the K planned tests are made on it. Few looks leave an early look able to decide (Jennison and Turnbull
  2000, ch. 2).
- Spending: Lan and DeMets (1983), Biometrika 70:659-663: alpha(t) = alpha ln(1 + (e - 1) t), t the
  information fraction (n / N paired; (1/m + 1/N) / (1/m + 1/n) against m stored runs), the continuous form
  of Pocock (1977). It gives the first look more of the error than the power family alpha t^rho, so a clear
  effect is decided at 3 pairs.
- The bound over looks: look k gets the one-sided level p_k = alpha(t_k) - alpha(t_(k-1)) and the interval
  mean +- t_(p_k, df_k) SE_k with its own variance estimate. By Bonferroni all K intervals hold the ratio
  with probability >= 1 - 2 sum p_k = 98 %, whatever the correlation of the looks.
"""

from __future__ import annotations

import math
import statistics
from functools import lru_cache

FIRST_LOOK = 3  # the default repeats: the fewest pairs whose interval can be narrow (2 pairs leave 1 df)


# -- distributions (no scipy) ---------------------------------------------------------------------------------
_NORMAL = statistics.NormalDist()


def normal_upper(z: float) -> float:
    """P(Z > z), accurate far in the tail."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def normal_upper_inv(p: float) -> float:
    """z with P(Z > z) = p."""
    return -_NORMAL.inv_cdf(p)


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
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


# -- the group-sequential boundary ----------------------------------------------------------------------------
def spent_pocock(t: float, alpha: float) -> float:
    """Lan-DeMets Pocock-type spending alpha ln(1 + (e - 1) t): the design's spending function."""
    return alpha * math.log1p((math.e - 1.0) * min(1.0, max(0.0, t)))


def planned_looks(max_pairs: int, first: int = FIRST_LOOK) -> tuple[int, ...]:
    """The pair (or candidate run) counts the design looks at: `first`, then doubling, the last at the budget
    `max_pairs`; a doubling that would leave less than half a step before the budget goes to the budget
    (3 6 12 for 12; 3 6 8 for 8; 3 6 13 for 13; 2 4 8 12 for a first look at 2)."""
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
    """One side's nominal level at each planned look: the spending increment at its information fraction
    (Bonferroni over the looks: they sum to `alpha`, one side's error over all looks)."""
    full = information(method, looks[-1], n_reference)
    out, prev = [], 0.0
    for n in looks:
        now = spent_pocock(information(method, n, n_reference) / full, alpha)
        out.append(max(0.0, now - prev))
        prev = now
    return tuple(out)

