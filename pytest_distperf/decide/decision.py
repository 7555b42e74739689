"""The one decision core: an interval of a ratio, and PASS / FAIL / INCONCLUSIVE decided on it.

Every verdict of the plugin goes through here: ratio checks between two strategies ("A within 1.1x
of B"), probe checks, and the baseline gate (candidate against stored runs). Pure Python over numbers.

The procedure: repeated confidence intervals (RCIs) of a two-sided group-sequential design with a few
*planned* looks, Pocock-type error spending, and a Bonferroni bound over the looks, on log ratios.

- Looks. The design looks at the first look n_1 (the test's repeats, 3 by default) and then at doubled
  pair counts up to the budget N (`planned_looks`: 3 -> 6 -> 12 for N = 12). Between planned looks it
  does not look: an estimate taken at n pairs, n_1 <= n_k <= n < n_(k+1), is the one of look k, over the
  first n_k pairs (the pairs after them wait for the next look), and the adaptive loops add pairs up to
  the next planned look before looking again. So however often, and by however many tests sharing the
  runs, a quantity is looked at, only the K planned tests are ever made on it. Few looks are what make an
  early one able to decide: with a look after every pair (the previous design: 11 looks from 2 to 12
  pairs) the error is spread so thin that the 3-pair critical value was 75.9 (Student's t with 2 df;
  63.3 had it spent the full 1 %). Jennison and Turnbull's tables (2000, ch. 2) show most of a
  sequential design's saving in expected sample size coming with its first few looks; Pocock (1977)
  used 2-5 looks.
- Spending. Lan, K. K. G. and DeMets, D. L. (1983), "Discrete sequential boundaries for clinical
  trials", Biometrika 70:659-663: the Pocock-type spending function alpha(t) = alpha ln(1 + (e - 1) t),
  t the information fraction (n / N paired; (1/m + 1/N) / (1/m + 1/n) against m stored runs). It is the
  continuous form of Pocock, S. J. (1977), "Group sequential methods in the design and analysis of
  clinical trials", Biometrika 64:191-199 (about equal nominal levels at equally spaced looks), and gives
  the first look more of the error than the power family alpha t^rho for rho >= 1: 36 % of it at 3 of 12 pairs,
  against 25 % for the Kim-DeMets power family with rho = 1 and 1.6 % with rho = 3 (Kim, K. and DeMets,
  D. L. (1987), Biometrika 74:149-154), the previous design's. A ratio 10 pair-SDs beyond its limit
  needs a 3-pair critical value of about 13 to be decided there in 80 % of cases; rho = 1 gives 14.1,
  Pocock-type 11.8. The price is paid at the last look: 3.26 at 12 pairs instead of 3.17.
- The bound over looks. Each look k gets the nominal one-sided level p_k = alpha(t_k) - alpha(t_(k-1)),
  the spending increment, and its interval is  mean +- t_(p_k, df_k) SE_k  with the look's own variance
  estimate. Under normal log ratios each paired look's t interval misses on one side with probability
  exactly p_k, so by Bonferroni's inequality all K intervals hold the ratio with probability
  >= 1 - 2 sum p_k = 98 %, whatever the correlation of the looks: the spending bounds the error without
  an approximation. (The recursive integration of Armitage, McPherson and Rowe 1969 -- `critical_values`,
  Jennison and Turnbull ch. 19 -- gains from the looks' correlation when the variance is known, but
  applied to Student's t at its nominal levels -- Jennison and Turnbull's significance-level approach --
  it ran to 1.1 % per side with these 3 looks, simulated; the previous design spent 0.7 of the error to
  stay under 1 % for the same reason, and needed 75.9 at 3 pairs.)
- Unpaired: Welch's statistic against t with Hsu's df min(n, m) - 1 is conservative under normality
  (Mickey, M. R. and Brown, M. B. (1966), "Bounds on the distribution functions of the Behrens-Fisher
  statistic", Ann. Math. Statist. 37:639-642), so the same bound holds. But a few candidate runs against
  many quiet stored runs are nearly a one-sample t test, and its tail runs above the nominal level for
  skewed log values (Pearson, E. S. and Please, N. W. (1975), Biometrika 62:223-241): with gamma run
  times (CV 50 %) against 40 stored runs a quarter as spread, 1.4 % false FAILs at the full error (the
  previous design: 1.5 %). Unpaired intervals therefore spend UNPAIRED_SHARE = 0.7 of it (0.9 % there).
Simulated false FAILs and false PASSes with the limit at the true ratio (benchmarks/decision_power.py,
results in benchmarks/results/decision-power.md; 100,000 sequences a case): paired <= 0.9 % for
Gaussian, skewed (gamma run times) and t3 log noise; unpaired <= 0.9 % for 2-40 stored runs spread
0.25-2x the candidate's. Beyond that contract, a pair log ratio (or a run) that is itself strongly
skewed (stragglers on one side: a centred gamma of shape 2) passes falsely up to 4.5 % paired and 3.0 %
unpaired (the previous design: 4.7 % and 4.4 %): a t test on 3-12 such values cannot be rescued by the
spending. tests/test_decision.py checks the paired and unpaired cases.
So a decision taken at whichever look stops the sequence -- "stop as soon as decided" -- is wrong with
probability <= 1 % per direction: at most 1 % false FAILs for an A/A comparison or an unchanged job. A
clear effect is decided at the first look: 10 pair-SDs beyond (or inside) the limit in 88-91 % of cases
at 3 pairs (the previous design: 5-9 %), 12 pair-SDs in 95 % (7-12 %). The price is at small effects: 1
pair-SD beyond the limit fails within 12 pairs in 60 % of cases instead of 66 %.
Alternatives weighed: Wald's SPRT and always-valid (confidence-sequence) intervals (Howard, Ramdas,
McAuliffe and Sekhon 2021, "Time-uniform, nonparametric, nonasymptotic confidence sequences", Ann.
Statist. 49:1055-1080) allow a look after every pair, but with an unknown variance and 3-12 observations
they are wider than a t interval of a few planned looks; a fixed-size t test decides only at its size.

Two ways to form the log ratios:
- paired: interleaved runs of A and B (A B, then B A, ...), d_i = log(a_i / b_i). Drift common to the
  two runs of a pair cancels: sd(d) = CV sqrt(2 (1 - rho)), rho the correlation of a pair's runs.
- unpaired: candidate runs against stored baseline runs, which cannot be paired. The log ratio of the
  geometric means with Welch's standard error and Hsu's conservative degrees of freedom
  min(n, m) - 1. A side with a single run has no variance: the interval is unbounded unless the other
  side showed no variance at all (a deterministic metric such as CUDA peak allocated), where it is the
  point. The stored runs are fixed; only the candidate side grows (its planned looks count candidate
  runs), so the information 1 / (1/m + 1/n) saturates at m: a baseline of few runs bounds what the
  gate can resolve (2 stored runs leave 1 df at every look).

Decision against a limit L ("at_most": ratio <= L is good): PASS when hi <= L, FAIL when lo > L,
INCONCLUSIVE while the interval holds L. `until_decided` adds pairs (or runs) up to the next planned
look while INCONCLUSIVE, within a budget of pairs, of wall-clock seconds, of the session's deadline and
of the test's share of it (`session_share`).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Callable, Sequence, TypeVar

T = TypeVar("T")  # what a look returns (look_until)

from pytest_distperf.measure.stats import relative_spread
from pytest_distperf.measure.wording import bound_text
from pytest_distperf.spec.settings import MAX_LOOKS

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
OUTCOMES = (PASS, FAIL, INCONCLUSIVE)
OUTCOME_MARK = {PASS: "✓ pass", FAIL: "✗ FAIL", INCONCLUSIVE: "~ inconclusive"}  # how every report shows them
DIRECTIONS = ("at_most", "at_least", "above")  # the good side of the limit: <=, >=, >
METHODS = ("paired", "unpaired", "exact")
DEFAULT_CONFIDENCE = 0.98  # simultaneous, two-sided: a wrong FAIL (or a wrong PASS) at most 1 %
DEFAULT_MAX_PAIRS = 12
FIRST_LOOK = 3  # the default repeats: the fewest pairs whose interval can be narrow (2 pairs leave 1 df)
# Unpaired intervals spend this share of each side's error: a few skewed candidate runs against many quiet stored
# runs are nearly a one-sample t test, whose tail runs above its nominal level (see the module docstring).
UNPAIRED_SHARE = 0.7


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


def spent_pocock(t: float, alpha: float) -> float:
    """Lan-DeMets Pocock-type spending alpha ln(1 + (e - 1) t): the design's spending function."""
    return alpha * math.log1p((math.e - 1.0) * min(1.0, max(0.0, t)))


SPENDING: dict[str, Callable[[float, float], float]] = {"pocock": spent_pocock, "power3": spent_power3,
                                                        "obrien-fleming": spent_obrien_fleming}
DESIGN_SPENDING = "pocock"


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
def critical_values(times: tuple[float, ...], alpha: float, spending: str = DESIGN_SPENDING) -> tuple[float, ...]:
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
def look_levels(method: str, looks: tuple[int, ...], alpha: float, n_reference: int = 0,
                spending: str = DESIGN_SPENDING) -> tuple[float, ...]:
    """One side's nominal level at each planned look: the spending increment at its information fraction
    (Bonferroni over the looks: they sum to `alpha`, one side's error over all looks)."""
    spent = SPENDING[spending]
    full = information(method, looks[-1], n_reference)
    out, prev = [], 0.0
    for n in looks:
        now = spent(information(method, n, n_reference) / full, alpha)
        out.append(max(0.0, now - prev))
        prev = now
    return tuple(out)


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


# -- records --------------------------------------------------------------------------------------------------
def fmt_ratio(x: float | None, digits: int = 3, unbounded: str = "inf") -> str:
    """A ratio or an interval end: fixed digits, or two significant ones when huge (an early look's interval)."""
    if x is None:
        return unbounded
    return f"{x:.{digits}f}" if x < 1000 else f"{x:.2g}"

def _opt(x: Any) -> float | None:
    return None if x is None else float(x)


@dataclass(frozen=True)
class Estimate:
    """A ratio with its interval. lo/hi None: unbounded (too few observations for a variance).

    method: paired (n_pairs interleaved pairs), unpaired (n_pairs candidate runs against n_reference stored
    runs) or exact (counts: the interval is the value). pair_cv: sd of the pairs' log ratios (paired);
    run_cv / run_cv_reference: sd of the log run values of each side (about the relative run-to-run spread)."""

    ratio: float
    lo: float | None
    hi: float | None
    level: float
    method: str
    n_pairs: int
    n_reference: int = 0
    pair_cv: float | None = None
    run_cv: float | None = None
    run_cv_reference: float | None = None
    df: float | None = None
    max_pairs: int = 0  # the design's budget the interval was computed for (0: exact)
    n_available: int = 0  # pairs (candidate runs) there were; more than n_pairs between planned looks (0: n_pairs)
    next_look: int | None = None  # the design's next planned look; 0: none (the last look); None: not said

    @property
    def unbounded(self) -> bool:
        return self.lo is None or self.hi is None

    @property
    def seen(self) -> int:
        """Pairs (or candidate runs) there were when this estimate was taken."""
        return max(self.n_available, self.n_pairs)

    def interval_text(self, digits: int = 3, decided: bool = False) -> str:
        """'[0.970, 1.160]', or in words where the interval is not bounded to a useful width
        (report/wording.bound_text: '3 pairs at 31.0% pair-to-pair: too few to bound; next look at 6')."""
        if self.method == "exact":
            return "exact"
        paired = self.method == "paired"
        return bound_text(self.ratio, self.lo, self.hi, self.n_pairs, "pairs" if paired else "runs",
                          self.pair_cv if paired else self.run_cv, "pair-to-pair" if paired else "run-to-run",
                          self.next_look, digits=digits, decided=decided)

    def text(self, digits: int = 3, decided: bool = False) -> str:
        """'1.060 [0.970, 1.160]'; '1.007: 3 pairs at 31.0% pair-to-pair: too few to bound; next look at 6'."""
        if self.method == "exact":
            return f"{self.ratio:.{digits}f}"
        interval = self.interval_text(digits, decided)
        return f"{self.ratio:.{digits}f}{':' if not interval.startswith('[') else ''} {interval}"

    def sample_text(self) -> str:
        """'3 interleaved pairs'; between planned looks 'the first 3 of 4 interleaved pairs (the planned look)'."""
        if self.method == "exact":
            return "exact counts"
        what = "interleaved pair" if self.method == "paired" else "run"
        if self.seen > self.n_pairs:
            count = f"the first {self.n_pairs} of {self.seen} {what}s (the planned look)"
        else:
            count = f"{self.n_pairs} {what}{'s' if self.n_pairs != 1 else ''}"
        return count if self.method == "paired" else f"{count} against {self.n_reference} stored"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Estimate":
        if d.get("method") not in METHODS:
            raise ValueError(f"estimate: method must be one of {METHODS}, got {d.get('method')!r}")
        return cls(ratio=float(d["ratio"]), lo=_opt(d.get("lo")), hi=_opt(d.get("hi")), level=float(d["level"]),
                   method=d["method"], n_pairs=int(d["n_pairs"]), n_reference=int(d.get("n_reference", 0)),
                   pair_cv=_opt(d.get("pair_cv")), run_cv=_opt(d.get("run_cv")),
                   run_cv_reference=_opt(d.get("run_cv_reference")), df=_opt(d.get("df")),
                   max_pairs=int(d.get("max_pairs", 0)), n_available=int(d.get("n_available", 0)),
                   next_look=None if d.get("next_look") is None else int(d["next_look"]))


@dataclass(frozen=True)
class Verdict:
    """What the core decided for one quantity: outcome against `limit` in `direction`, and why."""

    outcome: str  # pass | fail | inconclusive
    limit: float
    direction: str  # the good side of the limit: at_most (<=), at_least (>=), above (>)
    estimate: Estimate
    reason: str
    stopped: str = ""  # why no more pairs were run ("decided", "max 12 pairs", "wall-clock budget 300 s")

    def summary(self) -> str:
        """'inconclusive: 1.060 [0.970, 1.160] vs 1.10 after 3 interleaved pairs'."""
        return f"{self.outcome}: {self.estimate.text()} vs {self.limit:.2f} after {self.estimate.sample_text()}"

    def to_json(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "limit": self.limit, "direction": self.direction,
                "estimate": self.estimate.to_json(), "reason": self.reason, "stopped": self.stopped}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Verdict":
        if d.get("outcome") not in OUTCOMES or d.get("direction") not in DIRECTIONS:
            raise ValueError(f"verdict: outcome must be one of {OUTCOMES} and direction one of {DIRECTIONS}, "
                             f"got {d.get('outcome')!r} / {d.get('direction')!r}")
        return cls(outcome=d["outcome"], limit=float(d["limit"]), direction=d["direction"],
                   estimate=Estimate.from_json(d["estimate"]), reason=str(d.get("reason", "")),
                   stopped=str(d.get("stopped", "")))


@dataclass(frozen=True)
class Design:
    """confidence: of the repeated intervals (two-sided, simultaneous over the looks); max_pairs: the budget N,
    the last planned look; first_look: the first planned look (the test's repeats)."""

    confidence: float = DEFAULT_CONFIDENCE
    max_pairs: int = DEFAULT_MAX_PAIRS
    first_look: int = FIRST_LOOK

    def __post_init__(self) -> None:
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence!r}")
        if not 2 <= self.max_pairs <= MAX_LOOKS:
            raise ValueError(f"max_pairs must be in [2, {MAX_LOOKS}], got {self.max_pairs!r}")
        if self.first_look < 1:
            raise ValueError(f"first_look must be at least 1, got {self.first_look!r}")

    @property
    def alpha(self) -> float:
        """One side's error over all looks."""
        return (1.0 - self.confidence) / 2.0

    @property
    def looks(self) -> tuple[int, ...]:
        return planned_looks(self.max_pairs, self.first_look)

    def look_at(self, n: int) -> int:
        """The planned look n pairs have reached (the largest look <= n); 0 before the first."""
        return max((k for k in self.looks if k <= n), default=0)

    def next_look(self, n: int) -> int:
        """The next planned look after n pairs; 0 when n is at (or past) the last."""
        return min((k for k in self.looks if k > n), default=0)

    def level(self, method: str, look: int, n_reference: int = 0) -> float:
        """One side's nominal level at a planned look (unpaired: UNPAIRED_SHARE of the error is spent)."""
        alpha = self.alpha * (UNPAIRED_SHARE if method == "unpaired" else 1.0)
        return look_levels(method, self.looks, alpha, n_reference)[self.looks.index(look)]


# -- estimates ------------------------------------------------------------------------------------------------
def _logs(values: Sequence[float], what: str) -> list[float]:
    if any(not (v > 0) or math.isinf(v) for v in values):
        raise ValueError(f"{what}: ratios need positive, finite values, got {list(values)!r}")
    return [math.log(v) for v in values]


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample variance in floats (statistics.variance is exact and slow; this runs per look)."""
    n = len(xs)
    mean = math.fsum(xs) / n
    return mean, (math.fsum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0)


def _interval(mean: float, se: float, df: float, nominal: float) -> tuple[float | None, float | None]:
    if se == 0.0:
        return math.exp(mean), math.exp(mean)
    half = t_upper_inv(nominal, df) * se
    lo, hi = mean - half, mean + half
    # exp() of a huge half-width overflows: an interval wider than a factor 1e300 is unbounded anyway
    return (math.exp(lo) if lo > -690 else None), (math.exp(hi) if hi < 690 else None)


def paired(a: Sequence[float], b: Sequence[float], design: Design = Design()) -> Estimate:
    """A/B from interleaved pairs (a_i, b_i): geometric mean of the pair ratios, with its repeated interval at the
    planned look the pairs have reached, over that look's pairs (the module docstring says why)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired estimate needs equal, non-empty samples (got {len(a)} and {len(b)})")
    seen = len(a)
    look = design.look_at(seen)
    n = look or seen  # before the first look: every pair, for the point estimate
    a, b = list(a[:n]), list(b[:n])
    d = [x - y for x, y in zip(_logs(a, "A"), _logs(b, "B"))]
    mean, var = _mean_var(d)
    common = dict(ratio=math.exp(mean), level=design.confidence, method="paired", n_pairs=n, n_reference=n,
                  run_cv=relative_spread(a), run_cv_reference=relative_spread(b), max_pairs=design.max_pairs,
                  n_available=seen, next_look=design.next_look(seen) if look else design.looks[0])
    if n < 2:
        return Estimate(lo=None, hi=None, **common)
    sd = math.sqrt(var)
    if var == 0.0:  # every pair the same ratio (a deterministic metric): the interval is the point, at any look
        return Estimate(lo=math.exp(mean), hi=math.exp(mean), pair_cv=sd, df=float(n - 1), **common)
    if not look:
        return Estimate(lo=None, hi=None, pair_cv=sd, df=float(n - 1), **common)
    lo, hi = _interval(mean, sd / math.sqrt(n), n - 1, design.level("paired", look))
    return Estimate(lo=lo, hi=hi, pair_cv=sd, df=float(n - 1), **common)


def unpaired(candidate: Sequence[float], reference: Sequence[float], design: Design = Design()) -> Estimate:
    """candidate/reference from unpaired runs (the reference fixed, e.g. stored baseline runs): ratio of the
    geometric means, Welch standard error with Hsu's df, with its repeated interval at the planned look the
    candidate's runs have reached (over that look's runs)."""
    if not candidate or not reference:
        raise ValueError(f"unpaired estimate needs non-empty samples (got {len(candidate)} and {len(reference)})")
    seen = len(candidate)
    look = design.look_at(seen)
    candidate = list(candidate[:look or seen])
    y, x = _logs(candidate, "candidate"), _logs(reference, "reference")
    n, m = len(y), len(x)
    (my, vy), (mx, vx) = _mean_var(y), _mean_var(x)
    mean = my - mx
    common = dict(ratio=math.exp(mean), level=design.confidence, method="unpaired", n_pairs=n, n_reference=m,
                  run_cv=relative_spread(candidate), run_cv_reference=relative_spread(reference),
                  max_pairs=design.max_pairs, n_available=seen,
                  next_look=design.next_look(seen) if look else design.looks[0])
    if n < 2 or m < 2:
        # A side with one run has no variance of its own. Only a metric that has shown none on the other
        # side (CUDA peak allocated: the same bytes every run) is decided; anything else stays unbounded.
        if max(n, m) >= 2 and (vy if n >= 2 else vx) == 0.0:
            return Estimate(lo=math.exp(mean), hi=math.exp(mean), **common)
        return Estimate(lo=None, hi=None, **common)
    se2, df = vy / n + vx / m, float(min(n, m) - 1)
    if se2 == 0.0:
        return Estimate(lo=math.exp(mean), hi=math.exp(mean), df=df, **common)
    if not look:
        return Estimate(lo=None, hi=None, df=df, **common)
    lo, hi = _interval(mean, math.sqrt(se2), df, design.level("unpaired", look, m))
    return Estimate(lo=lo, hi=hi, df=df, **common)


def unpaired_resolution(reference: Sequence[float], n: int, design: Design = Design()) -> float | None:
    """How far the unpaired interval reaches each side of its ratio, as a factor, after `n` candidate runs as
    spread as these stored runs (at the planned look n reaches): a candidate then fails a limit L only when its
    ratio exceeds L x factor, and passes only when its ratio is below L / factor. None when the stored runs have
    no spread to go by (fewer than 2 runs) or n reaches no look; 1.0 for runs without any spread (exact metrics)."""
    m = len(reference)
    look = design.look_at(n)
    if m < 2 or look < 2:
        return None
    _, var = _mean_var(_logs(reference, "reference"))
    if var == 0.0:
        return 1.0
    nominal = design.level("unpaired", look, m)
    half = t_upper_inv(nominal, float(min(look, m) - 1)) * math.sqrt(var * (1.0 / m + 1.0 / look))
    return math.exp(min(half, 690.0))


def exact(ratio: float) -> Estimate:
    """A ratio of exact counts (collectives, bytes): no sampling noise, the interval is the value."""
    return Estimate(ratio=ratio, lo=ratio, hi=ratio, level=1.0, method="exact", n_pairs=1, n_reference=1)


# -- the decision ---------------------------------------------------------------------------------------------
def decide(estimate: Estimate, limit: float, direction: str = "at_most") -> Verdict:
    """PASS when the interval lies within the limit, FAIL when it lies beyond it, INCONCLUSIVE otherwise."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    lo = 0.0 if estimate.lo is None else estimate.lo
    hi = math.inf if estimate.hi is None else estimate.hi
    good, bad = {"at_most": (hi <= limit, lo > limit), "at_least": (lo >= limit, hi < limit),
                 "above": (lo > limit, hi <= limit)}[direction]
    where = f"{estimate.text(decided=good or bad)} vs {limit:.3g} after {estimate.sample_text()}"
    if good:
        return Verdict(PASS, limit, direction, estimate, f"{where}: the interval lies within the limit")
    if bad:
        return Verdict(FAIL, limit, direction, estimate, f"{where}: the interval lies beyond the limit")
    why = ("the interval cannot be bounded at this look" if estimate.unbounded and estimate.method != "exact"
           else "the interval holds the limit")
    return Verdict(INCONCLUSIVE, limit, direction, estimate, f"{where}: {why}")


# -- the stopping rule ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    """How far adaptive repeats may go: pairs (or candidate runs) in all, wall-clock seconds from the clock's
    start (the test's), a deadline on the monotonic clock shared by every test (the session's), and this test's
    share of the session (`session_share`), which only looks past the second planned one must keep to.
    first_look: the test's repeats, the first planned look."""

    max_pairs: int = DEFAULT_MAX_PAIRS
    seconds: float | None = None
    deadline: float | None = None
    deadline_text: str = "the session's wall-clock budget"
    first_look: int = FIRST_LOOK
    # A moment, or a function of (now, the test's elapsed seconds) on the test's clock giving one (the session's
    # share, decided when a third look is due: session.pairs_share).
    share_deadline: float | Callable[[float, float], float] | None = None
    share_text: str = "its share of the session's wall-clock budget"

    def __post_init__(self) -> None:
        if not 1 <= self.max_pairs <= MAX_LOOKS:
            raise ValueError(f"max_pairs must be in [1, {MAX_LOOKS}], got {self.max_pairs!r}")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError(f"seconds must be positive, got {self.seconds!r}")

    @property
    def looks(self) -> tuple[int, ...]:
        return planned_looks(self.max_pairs, self.first_look)

    def design(self, confidence: float = DEFAULT_CONFIDENCE) -> Design:
        """The design whose planned looks these adaptive repeats step to."""
        return Design(confidence=confidence, max_pairs=max(2, self.max_pairs), first_look=self.first_look)


def session_share(now: float, deadline: float, tests_left: int, reserve_each: float | None = None) -> float:
    """The moment after which a test may not run pairs for its third or later look. `tests_left` counts this test
    and every later one that may compare. With `reserve_each` (what a test's looks have cost so far in this
    session: each later test is held that much, enough for its first two looks) the share is everything but the
    later tests' reserve; without it, an equal share of the time left. Its first two looks are held only to the
    session's deadline, so every test gets its next planned look before an earlier one takes a third; what a test
    leaves goes to those after it."""
    left = max(0.0, deadline - now)
    if reserve_each is None:
        return now + left / max(1, tests_left)
    return now + max(0.0, left - reserve_each * max(0, tests_left - 1))


@dataclass
class Clock:
    """Wall-clock bookkeeping of one sequence: started, and how long each added pair took."""

    started: float = field(default_factory=time.monotonic)
    pair_seconds: list[float] = field(default_factory=list)
    now: Callable[[], float] = time.monotonic

    def elapsed(self) -> float:
        return self.now() - self.started


def progress_text(v: Verdict, next_look: int) -> str:
    """'inconclusive after 3 pairs (1.06 [0.97, 1.16] vs 1.10), running pairs 4-6 for the look at 6'."""
    e = v.estimate
    unit = "pairs" if e.method == "paired" else "runs"
    first = e.seen + 1
    span = f"{unit[:-1]} {first}" if first == next_look else f"{unit} {first}-{next_look}"
    return (f"inconclusive after {e.n_pairs} {unit} ({e.text(2)} vs {v.limit:.2f}), running {span} for the look "
            f"at {next_look}")


def next_step(pairs: int, budget: Budget) -> int:
    """The planned look the next pairs go to (0: none left)."""
    return min((k for k in budget.looks if k > pairs), default=0)


def stop_reason(pairs: int, budget: Budget, clock: Clock) -> str | None:
    """Why no pairs may start toward the next planned look (None: they may): the pair budget, or pairs that would
    end past the wall-clock budget, the deadline, or -- for a third or later look -- this test's share of the
    session (judged by the mean duration of the pairs added so far, times the pairs the step needs)."""
    target = next_step(pairs, budget)
    if not target:
        return f"max {budget.max_pairs} {'pairs' if budget.max_pairs != 1 else 'pair'}"
    expected = statistics.fmean(clock.pair_seconds) * (target - pairs) if clock.pair_seconds else 0.0
    if budget.seconds is not None and clock.elapsed() + expected > budget.seconds:
        return f"wall-clock budget {budget.seconds:g} s"
    if budget.deadline is not None and clock.now() + expected > budget.deadline:
        return budget.deadline_text
    if budget.share_deadline is not None and budget.looks.index(target) >= 2:
        share = budget.share_deadline
        if callable(share):
            share = share(clock.now(), clock.elapsed())
        if clock.now() + expected > share:
            return budget.share_text
    return None


def look_until(look: Callable[[], T], pending: Callable[[T], bool], seen: Callable[[T], int],
               add_pair: Callable[[], None] | None, budget: Budget, clock: Clock,
               progress: Callable[[T, int], None] | None = None) -> tuple[T, str]:
    """The one stopping rule of adaptive repeats: look; while `pending` holds of the look and the budget allows,
    add pairs (or runs) up to the next planned look and look again. Returns the last look and why it stopped:
    "decided", "fixed runs" (no `add_pair`), or stop_reason's words. `seen`: the pairs (runs) the look was over;
    `progress(look, next planned look)` before pairs are added."""
    while True:
        current = look()
        if not pending(current):
            return current, "decided"
        if add_pair is None:
            return current, "fixed runs"
        n = seen(current)
        why = stop_reason(n, budget, clock)
        if why:
            return current, why
        target = next_step(n, budget)
        if progress:
            progress(current, target)
        for _ in range(target - n):  # the pairs between planned looks are not looked at
            started = clock.now()
            add_pair()
            clock.pair_seconds.append(clock.now() - started)


def until_decided(look: Callable[[], Verdict], add_pair: Callable[[], None] | None, budget: Budget,
                  clock: Clock | None = None, progress: Callable[[str], None] | None = None) -> Verdict:
    """One quantity's verdict under look_until: while INCONCLUSIVE, pairs up to the next planned look.

    `look` decides on all the data there is (it may already hold more pairs than this sequence added: runs shared
    with other tests); the estimate is the planned look's, so every look is covered by the repeated intervals."""
    v, why = look_until(look, lambda v: v.outcome == INCONCLUSIVE, lambda v: v.estimate.seen, add_pair, budget,
                        clock or Clock(), (lambda v, target: progress(progress_text(v, target))) if progress else None)
    return Verdict(**{**_fields(v), "stopped": why})


def _fields(v: Verdict) -> dict[str, Any]:
    return {"outcome": v.outcome, "limit": v.limit, "direction": v.direction, "estimate": v.estimate,
            "reason": v.reason}
