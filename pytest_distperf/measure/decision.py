"""The one decision core: an interval of a ratio, and PASS / FAIL / INCONCLUSIVE decided on it.

Every verdict of the plugin goes through here: ratio checks between two strategies ("A within 1.1x
of B"), probe checks, and the baseline gate (candidate against stored runs). Pure Python over numbers.

The procedure: repeated confidence intervals (RCIs) of a two-sided group-sequential design with
Lan-DeMets error spending, on log ratios.

- Jennison, C. and Turnbull, B. W. (2000), *Group Sequential Methods with Applications to Clinical
  Trials*, Chapman & Hall/CRC: error spending (ch. 7), repeated confidence intervals (ch. 9), the
  recursive numerical integration that gives the critical values (ch. 19; Armitage, McPherson and
  Rowe 1969). Jennison and Turnbull (1989), "Interim analyses: the repeated confidence interval
  approach", JRSS B 51:305-361.
- Lan, K. K. G. and DeMets, D. L. (1983), "Discrete sequential boundaries for clinical trials",
  Biometrika 70:659-663 (error spending); Kim, K. and DeMets, D. L. (1987), "Design and analysis of
  group sequential tests based on the type I error spending rate function", Biometrika 74:149-154:
  the spending function used here is their power family alpha(t) = alpha t^3, the member close to
  O'Brien-Fleming (J&T sec. 7.3), t the information fraction. Against Lan-DeMets' own
  O'Brien-Fleming type it decides a clear effect about one pair sooner at nearly the same power at
  the budget (simulated: +5 % at 1.6 % pair noise, median 6 pairs instead of 7).

After n observations the interval of the mean log ratio is  mean +- c_n SE_n.  c_n is found from the
known-variance design: the critical value z_n at look n of the symmetric two-sided test that spends
alpha(t_n) per side by look n, with a look after *every* observation from the first possible one to the
budget N. The variance is estimated, so z_n's nominal significance level 1 - Phi(z_n) is applied to
Student's t with the estimate's degrees of freedom (Jennison and Turnbull's significance-level approach
for unknown variance). With one pair per look and few degrees of freedom that approach runs above its
nominal error (simulated: 1.17 % for a nominal 1 %), so the design spends 0.7 % per side; the intervals
of all looks then hold the true ratio simultaneously with probability >= 98 % (simulated false FAILs
with the limit at the true ratio, N = 3..30 pairs: paired 0.80-0.83 % for Gaussian noise, <= 0.89 %
for skewed run times, 0.5-0.6 % for t3 noise; unpaired <= 0.84 % for 2..40 stored runs whose spread is
0.25-2 x the candidate's; tests/test_decision.py checks the paired and unpaired cases).
So a decision taken at whichever look stops
the sequence -- "stop as soon as decided" -- is wrong with probability <= 1 % per direction: at most 1 %
false FAILs for an A/A comparison or an unchanged job, however often the data was looked at. A few
observations give wide, honest intervals (with 2-3 pairs nearly always INCONCLUSIVE); stopping early
because a budget ran out only leaves error unspent.

Two ways to form the log ratios:
- paired: interleaved runs of A and B (A B, then B A, ...), d_i = log(a_i / b_i). Drift common to the
  two runs of a pair cancels: sd(d) = CV sqrt(2 (1 - rho)), rho the correlation of a pair's runs.
- unpaired: candidate runs against stored baseline runs, which cannot be paired. The log ratio of the
  geometric means with Welch's standard error and Hsu's conservative degrees of freedom
  min(n, m) - 1 (Welch-Satterthwaite's df ran to 1.5-3 % false FAILs over the looks with 2-3 stored
  runs, and above 2 % with 20 stored runs at the first looks). A side with a single run has no
  variance: the interval is unbounded unless the other side showed no variance at all (a
  deterministic metric such as CUDA peak allocated), where it is the point. The stored runs are
  fixed; only the candidate side grows, so the information 1 / (1/m + 1/n) saturates at m: a baseline
  of few runs bounds what the gate can resolve.

Decision against a limit L ("at_most": ratio <= L is good): PASS when hi <= L, FAIL when lo > L,
INCONCLUSIVE while the interval holds L. `until_decided` adds pairs (or runs) while INCONCLUSIVE, up to
a budget of pairs and of wall-clock seconds.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, Callable, Sequence

from pytest_distperf.measure.stats import relative_spread

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
OUTCOMES = (PASS, FAIL, INCONCLUSIVE)
OUTCOME_MARK = {PASS: "✓ pass", FAIL: "✗ FAIL", INCONCLUSIVE: "~ inconclusive"}  # how every report shows them
DIRECTIONS = ("at_most", "at_least", "above")  # the good side of the limit: <=, >=, >
METHODS = ("paired", "unpaired", "exact")
DEFAULT_CONFIDENCE = 0.98  # simultaneous, two-sided: a wrong FAIL (or a wrong PASS) at most 1 %
DEFAULT_MAX_PAIRS = 12
# The known-variance design spends this share of each side's error: the t approximation adds the rest
# (see the module docstring).
T_APPROXIMATION_SHARE = 0.7


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
    """Kim-DeMets power family alpha t^rho with rho = 3, the member close to O'Brien-Fleming: the
    design's spending function."""
    return alpha * min(1.0, max(0.0, t)) ** 3


SPENDING: dict[str, Callable[[float, float], float]] = {"power3": spent_power3,
                                                        "obrien-fleming": spent_obrien_fleming}
DESIGN_SPENDING = "power3"


_GRID = 81  # Simpson points over the continuation region (odd), at least; more where increments are small
MAX_LOOKS = 64  # the budget's ceiling: the boundaries are computed for a look after every pair up to it
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


def _paired_times(n_max: int) -> tuple[float, ...]:
    """Looks after every pair from 2 (the first with a variance) to n_max."""
    return tuple(n / n_max for n in range(2, n_max + 1))


def _unpaired_times(m: int, n_min: int, n_max: int) -> tuple[float, ...]:
    """Looks after every candidate run from n_min; information 1/(1/m + 1/n) relative to its value at n_max."""
    full = 1.0 / (1.0 / m + 1.0 / n_max)
    return tuple(min(1.0, (1.0 / (1.0 / m + 1.0 / n)) / full) for n in range(n_min, n_max + 1))


@lru_cache(maxsize=4096)
def nominal_level(method: str, n: int, n_max: int, alpha: float, n_reference: int = 0) -> float:
    """One side's nominal significance level at look n (n pairs, or n candidate runs against n_reference);
    `alpha`: one side's error over all looks."""
    n_max = max(n_max, n)  # runs shared with a test of a larger budget: the schedule runs to where the data is
    if n_max > MAX_LOOKS:
        raise ValueError(f"the design looks after every pair up to {MAX_LOOKS}; {n_max} pairs (or runs) is beyond it")
    times = _paired_times(n_max) if method == "paired" else _unpaired_times(n_reference, 2, n_max)
    return normal_upper(critical_values(times, alpha)[n - 2])


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

    @property
    def unbounded(self) -> bool:
        return self.lo is None or self.hi is None

    def interval_text(self, digits: int = 3) -> str:
        if self.method == "exact":
            return "exact"
        return f"[{fmt_ratio(self.lo, digits, '0')}, {fmt_ratio(self.hi, digits, 'inf')}]"

    def text(self, digits: int = 3) -> str:
        """'1.060 [0.970, 1.160]'."""
        if self.method == "exact":
            return f"{self.ratio:.{digits}f}"
        return f"{self.ratio:.{digits}f} {self.interval_text(digits)}"

    def sample_text(self) -> str:
        if self.method == "paired":
            return f"{self.n_pairs} interleaved pair{'s' if self.n_pairs != 1 else ''}"
        if self.method == "unpaired":
            return f"{self.n_pairs} run(s) against {self.n_reference} stored"
        return "exact counts"

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
                   max_pairs=int(d.get("max_pairs", 0)))


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
    """confidence: of the repeated intervals (two-sided); max_pairs: the budget N the boundaries spend to."""

    confidence: float = DEFAULT_CONFIDENCE
    max_pairs: int = DEFAULT_MAX_PAIRS

    def __post_init__(self) -> None:
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence!r}")
        if not 2 <= self.max_pairs <= MAX_LOOKS:
            raise ValueError(f"max_pairs must be in [2, {MAX_LOOKS}], got {self.max_pairs!r}")

    @property
    def alpha(self) -> float:
        """One side's error over all looks in the known-variance design."""
        return (1.0 - self.confidence) / 2.0 * T_APPROXIMATION_SHARE


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
    """A/B from interleaved pairs (a_i, b_i): geometric mean of the pair ratios, with its repeated interval."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired estimate needs equal, non-empty samples (got {len(a)} and {len(b)})")
    d = [x - y for x, y in zip(_logs(a, "A"), _logs(b, "B"))]
    n = len(d)
    mean, var = _mean_var(d)
    common = dict(ratio=math.exp(mean), level=design.confidence, method="paired", n_pairs=n, n_reference=n,
                  run_cv=relative_spread(a), run_cv_reference=relative_spread(b), max_pairs=max(design.max_pairs, n))
    if n < 2:
        return Estimate(lo=None, hi=None, **common)
    sd = math.sqrt(var)
    lo, hi = _interval(mean, sd / math.sqrt(n), n - 1, nominal_level("paired", n, design.max_pairs, design.alpha))
    return Estimate(lo=lo, hi=hi, pair_cv=sd, df=float(n - 1), **common)


def unpaired(candidate: Sequence[float], reference: Sequence[float], design: Design = Design()) -> Estimate:
    """candidate/reference from unpaired runs (the reference fixed, e.g. stored baseline runs): ratio of the
    geometric means, Welch standard error with Hsu's df, with its repeated interval over the candidate's looks."""
    if not candidate or not reference:
        raise ValueError(f"unpaired estimate needs non-empty samples (got {len(candidate)} and {len(reference)})")
    y, x = _logs(candidate, "candidate"), _logs(reference, "reference")
    n, m = len(y), len(x)
    (my, vy), (mx, vx) = _mean_var(y), _mean_var(x)
    mean = my - mx
    common = dict(ratio=math.exp(mean), level=design.confidence, method="unpaired", n_pairs=n, n_reference=m,
                  run_cv=relative_spread(candidate), run_cv_reference=relative_spread(reference),
                  max_pairs=max(design.max_pairs, n))
    if n < 2 or m < 2:
        # A side with one run has no variance of its own. Only a metric that has shown none on the other
        # side (CUDA peak allocated: the same bytes every run) is decided; anything else stays unbounded.
        if max(n, m) >= 2 and (vy if n >= 2 else vx) == 0.0:
            return Estimate(lo=math.exp(mean), hi=math.exp(mean), **common)
        return Estimate(lo=None, hi=None, **common)
    se2, df = vy / n + vx / m, float(min(n, m) - 1)
    nominal = nominal_level("unpaired", n, design.max_pairs, design.alpha, m)
    lo, hi = _interval(mean, math.sqrt(se2), df, nominal)
    return Estimate(lo=lo, hi=hi, df=df, **common)


def unpaired_resolution(reference: Sequence[float], n: int, design: Design = Design()) -> float | None:
    """How far the unpaired interval reaches each side of its ratio, as a factor, after `n` candidate runs as
    spread as these stored runs: a candidate then fails a limit L only when its ratio exceeds L x factor, and
    passes only when its ratio is below L / factor. None when the stored runs have no spread to go by (fewer
    than 2 runs); 1.0 for runs without any spread (exact metrics)."""
    m = len(reference)
    if m < 2 or n < 2:
        return None
    _, var = _mean_var(_logs(reference, "reference"))
    if var == 0.0:
        return 1.0
    nominal = nominal_level("unpaired", n, design.max_pairs, design.alpha, m)
    half = t_upper_inv(nominal, float(min(n, m) - 1)) * math.sqrt(var * (1.0 / m + 1.0 / n))
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
    where = f"{estimate.text()} vs {limit:.3g} after {estimate.sample_text()}"
    good, bad = {"at_most": (hi <= limit, lo > limit), "at_least": (lo >= limit, hi < limit),
                 "above": (lo > limit, hi <= limit)}[direction]
    if good:
        return Verdict(PASS, limit, direction, estimate, f"{where}: the interval lies within the limit")
    if bad:
        return Verdict(FAIL, limit, direction, estimate, f"{where}: the interval lies beyond the limit")
    why = "too few observations for an interval" if estimate.unbounded else "the interval holds the limit"
    return Verdict(INCONCLUSIVE, limit, direction, estimate, f"{where}: {why}")


# -- the stopping rule ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Budget:
    """How far adaptive repeats may go: pairs (or candidate runs) in all, wall-clock seconds from the clock's
    start (the test's), and a deadline on the monotonic clock shared by every test (the session's)."""

    max_pairs: int = DEFAULT_MAX_PAIRS
    seconds: float | None = None
    deadline: float | None = None
    deadline_text: str = "the session's wall-clock budget"

    def __post_init__(self) -> None:
        if not 1 <= self.max_pairs <= MAX_LOOKS:
            raise ValueError(f"max_pairs must be in [1, {MAX_LOOKS}], got {self.max_pairs!r}")
        if self.seconds is not None and self.seconds <= 0:
            raise ValueError(f"seconds must be positive, got {self.seconds!r}")


@dataclass
class Clock:
    """Wall-clock bookkeeping of one sequence: started, and how long each added pair took."""

    started: float = field(default_factory=time.monotonic)
    pair_seconds: list[float] = field(default_factory=list)
    now: Callable[[], float] = time.monotonic

    def elapsed(self) -> float:
        return self.now() - self.started


def progress_text(v: Verdict, next_pair: int) -> str:
    """'inconclusive after 3 pairs (1.06 [0.97, 1.16] vs 1.10), running pair 4'."""
    e = v.estimate
    unit = "pairs" if e.method == "paired" else "runs"
    return (f"inconclusive after {e.n_pairs} {unit} ({e.text(2)} vs {v.limit:.2f}), "
            f"running {'pair' if e.method == 'paired' else 'run'} {next_pair}")


def stop_reason(pairs: int, budget: Budget, clock: Clock) -> str | None:
    """Why no further pair may start (None: one may): the pair budget, or a pair that would end past the
    wall-clock budget or the deadline (judged by the mean duration of the pairs added so far)."""
    if pairs >= budget.max_pairs:
        return f"max {budget.max_pairs} {'pairs' if budget.max_pairs != 1 else 'pair'}"
    expected = statistics.fmean(clock.pair_seconds) if clock.pair_seconds else 0.0
    if budget.seconds is not None and clock.elapsed() + expected > budget.seconds:
        return f"wall-clock budget {budget.seconds:g} s"
    if budget.deadline is not None and clock.now() + expected > budget.deadline:
        return budget.deadline_text
    return None


def until_decided(look: Callable[[], Verdict], add_pair: Callable[[], None], budget: Budget,
                  clock: Clock | None = None, progress: Callable[[str], None] | None = None) -> Verdict:
    """Look; while INCONCLUSIVE and the budget allows, add a pair (or run) and look again.

    `look` decides on all the data there is (it may already hold more pairs than this sequence added:
    runs shared with other tests); every look is covered by the repeated intervals."""
    clock = clock or Clock()
    while True:
        v = look()
        if v.outcome != INCONCLUSIVE:
            return Verdict(**{**_fields(v), "stopped": "decided"})
        why = stop_reason(v.estimate.n_pairs, budget, clock)
        if why:
            return Verdict(**{**_fields(v), "stopped": why})
        if progress:
            progress(progress_text(v, v.estimate.n_pairs + 1))
        started = clock.now()
        add_pair()
        clock.pair_seconds.append(clock.now() - started)


def _fields(v: Verdict) -> dict[str, Any]:
    return {"outcome": v.outcome, "limit": v.limit, "direction": v.direction, "estimate": v.estimate,
            "reason": v.reason}
