"""Step changes in one metric's series of sessions (oldest first).

E-divisive with a t-test, as MongoDB (Daly et al., ICPE 2020) and Apache Otava use it: split a segment where a
change is most likely (ruptures' `Binseg` with the bounded RBF kernel cost, so one outlying session does not pull
the split to itself), keep the split when a Welch t-test gives p <= `alpha`, recurse into both halves, then
re-test every kept split between its neighbours and drop the weakest until all hold. The p-value is not corrected
for the search over splits (as in Otava), hence the strict default `alpha`.
"""

from __future__ import annotations

import math
import statistics
import warnings
from dataclasses import dataclass

DEFAULT_ALPHA = 0.001
DEFAULT_MIN_SIZE = 3


@dataclass(frozen=True)
class Split:
    """A kept step change: `index` is the first point after it."""

    index: int
    before_mean: float
    after_mean: float
    pvalue: float
    tstat: float

    @property
    def change(self) -> float | None:
        """after/before - 1 (None when the level before is 0)."""
        return self.after_mean / self.before_mean - 1 if self.before_mean else None


def find_splits(values: list[float], alpha: float = DEFAULT_ALPHA, min_size: int = DEFAULT_MIN_SIZE,
                min_change: float = 0.0) -> list[Split]:
    """The step changes in `values` (one value per session, in order), sorted by index; `min_change`: also
    require |after/before - 1| >= this (0: significance alone decides)."""
    if min_size < 2:
        raise ValueError(f"min_size must be at least 2 (a t-test needs two values a side), got {min_size}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    n = len(values)
    if n < 2 * min_size:
        return []
    proposer = _proposer(values, min_size)
    kept: set[int] = set()
    pending = [(0, n)]
    while pending:
        start, end = pending.pop()
        if end - start < 2 * min_size:
            continue
        index, _gain = proposer.single_bkp(start, end)
        if index is None:
            continue
        test = _test(values[start:index], values[index:end])
        if _holds(test["pvalue"], test["before_mean"], test["after_mean"], alpha, min_change):
            kept.add(index)
            pending += [(start, index), (index, end)]
    return _prune(values, sorted(kept), alpha, min_change)


def strongest_split(values: list[float], min_size: int = DEFAULT_MIN_SIZE) -> Split | None:
    """The split the search would try first over the whole series, with its test, whether it holds or not
    (to say how far from significant a visible step is)."""
    if len(values) < 2 * max(min_size, 2):
        return None
    index, _gain = _proposer(values, min_size).single_bkp(0, len(values))
    return None if index is None else Split(index=index, **_test(values[:index], values[index:]))


def _proposer(values: list[float], min_size: int):
    import numpy as np
    import ruptures

    signal = np.asarray(values, dtype=float).reshape(-1, 1)
    return ruptures.Binseg(model="rbf", min_size=min_size, jump=1).fit(signal)


def _prune(values: list[float], indices: list[int], alpha: float, min_change: float) -> list[Split]:
    """Re-test each split between its neighbours; drop the weakest failing one until every split holds."""
    while True:
        bounds = [0, *indices, len(values)]
        splits = [Split(index=i, **_test(values[bounds[k]:i], values[i:bounds[k + 2]]))
                  for k, i in enumerate(indices)]
        weak = [s for s in splits if not _holds(s.pvalue, s.before_mean, s.after_mean, alpha, min_change)]
        if not weak:
            return splits
        worst = max(weak, key=lambda s: s.pvalue)
        indices = [i for i in indices if i != worst.index]


def _holds(pvalue: float, before: float, after: float, alpha: float, min_change: float) -> bool:
    if not pvalue <= alpha:  # also False for nan
        return False
    change = abs(after / before - 1) if before else math.inf if after != before else 0.0
    return change >= min_change


def _test(before: list[float], after: list[float]) -> dict:
    """Welch's t-test of the two sides' means (two-sided); two constant sides differ with p = 0."""
    mean_b, mean_a = statistics.fmean(before), statistics.fmean(after)
    var_b, var_a = statistics.variance(before), statistics.variance(after)
    if var_b == 0 and var_a == 0:
        if mean_a == mean_b:
            return {"before_mean": mean_b, "after_mean": mean_a, "pvalue": 1.0, "tstat": 0.0}
        return {"before_mean": mean_b, "after_mean": mean_a, "pvalue": 0.0,
                "tstat": math.copysign(math.inf, mean_a - mean_b)}
    from scipy import stats

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # near-constant sides: scipy's precision note
        result = stats.ttest_ind(after, before, equal_var=False)
    return {"before_mean": mean_b, "after_mean": mean_a, "pvalue": float(result.pvalue),
            "tstat": float(result.statistic)}
