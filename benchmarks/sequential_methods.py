"""Group-sequential methods the benchmarks weigh the shipped design against (pytest_distperf.decide.sequential:
Lan-DeMets Pocock-type spending, Bonferroni over a few planned looks). The plugin never calls these.

- Spending functions beside the design's: Lan-DeMets O'Brien-Fleming-type (Lan, K. K. G. and DeMets, D. L.
  (1983), Biometrika 70:659-663) and the Kim-DeMets power family with rho = 3 (Kim, K. and DeMets, D. L.
  (1987), Biometrika 74:149-154), the previous design's.
- `critical_values`: known-variance boundaries by the recursive integration of Armitage, McPherson and Rowe
  (1969), as in Jennison and Turnbull (2000), ch. 19; tests/test_decision.py checks it against gsDesign's and
  ldbounds' published O'Brien-Fleming boundaries, benchmarks/decision_power.py runs the previous design on it.
- `nominal_level`: the level of the planned look n pairs have reached, a convenience over the design's
  planned_looks and look_levels.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Callable

from pytest_distperf.decide.sequential import (FIRST_LOOK, look_levels, normal_upper, normal_upper_inv,
                                               planned_looks, spent_pocock)


def spent_obrien_fleming(t: float, alpha: float) -> float:
    """Lan-DeMets O'Brien-Fleming-type spending of one side's error `alpha` by information fraction t (the
    per-side form gsDesign and ldbounds use for symmetric two-sided boundaries; kept to check the
    integration against their published boundaries)."""
    if t <= 0.0:
        return 0.0
    if t >= 1.0:
        return alpha
    return 2.0 * normal_upper(normal_upper_inv(alpha / 2.0) / math.sqrt(t))


def spent_power3(t: float, alpha: float) -> float:
    """Kim-DeMets power family alpha t^rho with rho = 3, the member close to O'Brien-Fleming (the previous
    design's, kept for benchmarks/decision_power.py's comparison)."""
    return alpha * min(1.0, max(0.0, t)) ** 3


SPENDING: dict[str, Callable[[float, float], float]] = {"pocock": spent_pocock, "power3": spent_power3,
                                                        "obrien-fleming": spent_obrien_fleming}


_GRID = 81  # Simpson points over the continuation region (odd), at least; more where increments are small
_C_MAX = 12.0  # a look that spends (next to) nothing: nominal level ~1e-33


def _simpson(lo: float, hi: float, n: int) -> tuple[list[float], list[float]]:
    h = (hi - lo) / (n - 1)
    points = [lo + i * h for i in range(n)]
    weights = [h / 3.0 * (1 if i in (0, n - 1) else (4 if i % 2 else 2)) for i in range(n)]
    return points, weights


def _phi(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


@lru_cache(maxsize=256)
def critical_values(times: tuple[float, ...], alpha: float, spending: str = "pocock") -> tuple[float, ...]:
    """Symmetric critical values z_1..z_K (known variance) at information fractions `times` (increasing, the
    last 1) so that P(Z_k >= z_k first at look k) = spent(t_k) - spent(t_{k-1}) under no effect, on each
    side: `alpha` is one side's error, `spending` a name in SPENDING.

    Recursive integration of the sub-density of the score statistic S_k = Z_k sqrt(t_k), which has
    independent N(0, t_k - t_{k-1}) increments, over the continuation region of the previous look."""
    spent = SPENDING[spending]
    crit: list[float] = []
    mass: list[tuple[float, float]] = []  # (s, Simpson weight x sub-density) of the previous look
    prev_t = prev_spent = 0.0
    for k, t in enumerate(times):
        target = max(0.0, spent(t, alpha) - prev_spent)
        if k == 0:
            c = _C_MAX if target <= 0 else min(_C_MAX, normal_upper_inv(target))
        else:
            sd = math.sqrt(t - prev_t)
            root = math.sqrt(t)

            def crossing(c: float) -> float:
                b = c * root
                return sum(w * (normal_upper((b - u) / sd) + normal_upper((b + u) / sd)) for u, w in mass)

            target *= 2.0  # both sides
            if target <= 0 or crossing(_C_MAX) >= target:
                c = _C_MAX
            else:
                lo, hi = 0.0, _C_MAX
                for _ in range(60):
                    mid = 0.5 * (lo + hi)
                    if crossing(mid) > target:
                        lo = mid
                    else:
                        hi = mid
                c = 0.5 * (lo + hi)
        crit.append(c)
        # The sub-density of S_k on the continuation region (|S_k| < c sqrt(t)), cut where it is negligible.
        b = min(c, 9.0) * math.sqrt(t)
        step_sd = math.sqrt(times[k + 1] - t) if k + 1 < len(times) else 1.0
        points, weights = _simpson(-b, b, max(_GRID, 2 * math.ceil(3.0 * b / step_sd) + 1))  # spacing <= sd/3
        if k == 0:
            dens = [_phi(s / math.sqrt(t)) / math.sqrt(t) for s in points]
        else:
            sd = math.sqrt(t - prev_t)
            dens = [sum(w * _phi((s - u) / sd) for u, w in mass) / sd for s in points]
        mass = [(s, w * f) for s, w, f in zip(points, weights, dens)]
        prev_t, prev_spent = t, spent(t, alpha)
    return tuple(crit)


def nominal_level(method: str, n: int, n_max: int, alpha: float, n_reference: int = 0,
                  first: int = FIRST_LOOK) -> float:
    """One side's nominal level of the planned look that n pairs (or n candidate runs against n_reference)
    have reached, looks `planned_looks(n_max, first)`; 0.0 before the first look (nothing is spent there).
    `alpha` is spent as given: Design.level also applies UNPAIRED_SHARE to unpaired looks."""
    looks = planned_looks(n_max, first)
    reached = [k for k, look in enumerate(looks) if look <= n]
    if not reached:
        return 0.0
    return look_levels(method, looks, alpha, n_reference)[reached[-1]]
