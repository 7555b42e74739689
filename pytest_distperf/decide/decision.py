"""The one decision core: an interval of a ratio, and PASS / FAIL / INCONCLUSIVE decided on it.

The intervals are repeated confidence intervals of a group-sequential design on log ratios (decide/sequential.py),
so a decision taken at whichever look stops the sequence is wrong with probability <= 1 % per direction.
- paired: interleaved runs A B, B A, ...: d_i = log(a_i / b_i); drift common to a pair cancels.
- unpaired: candidate runs against fixed stored runs: Welch's standard error with Hsu's conservative df
  min(n, m) - 1 (Mickey and Brown 1966). A few candidate runs against many quiet stored runs are nearly a
  one-sample t test, whose tail runs above its level for skewed log values (Pearson and Please 1975), so these
  intervals spend UNPAIRED_SHARE of the error. A side with one run has no variance: the interval is unbounded
  unless the other side showed none at all (a deterministic metric), where it is the point.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from pytest_distperf.decide.sequential import FIRST_LOOK, look_levels, planned_looks, t_upper_inv
from pytest_distperf.figures.stats import relative_spread
from pytest_distperf.figures.wording import bound_text
from pytest_distperf.spec.settings import MAX_LOOKS

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
# What one step of adaptive repeats adds, by method: an interleaved pair, or a candidate run against stored ones
SAMPLE_UNITS = {"paired": "pairs", "unpaired": "runs"}
OUTCOMES = (PASS, FAIL, INCONCLUSIVE)
DIRECTIONS = ("at_most", "at_least", "above")  # the good side of the limit: <=, >=, >
METHODS = ("paired", "unpaired", "exact")
DEFAULT_CONFIDENCE = 0.98  # simultaneous, two-sided: a wrong FAIL (or a wrong PASS) at most 1 %
DEFAULT_MAX_PAIRS = 12
UNPAIRED_SHARE = 0.7


@dataclass(frozen=True)
class Estimate:
    """A ratio with its interval; lo/hi None: unbounded. method: paired (n_pairs interleaved pairs), unpaired
    (n_pairs candidate runs against n_reference stored runs) or exact (counts: the interval is the value)."""

    ratio: float
    lo: float | None
    hi: float | None
    level: float
    method: str
    n_pairs: int
    n_reference: int = 0
    pair_cv: float | None = None  # sd of the pairs' log ratios
    run_cv: float | None = None  # sd of each side's log run values
    run_cv_reference: float | None = None
    df: float | None = None
    max_pairs: int = 0  # the design's budget (0: exact)
    n_available: int = 0  # pairs there were; more than n_pairs between planned looks (0: n_pairs)
    next_look: int | None = None  # 0: none (the last look); None: not said

    @property
    def unbounded(self) -> bool:
        return self.lo is None or self.hi is None

    @property
    def unit(self) -> str:
        """'pairs' or 'runs': what the estimate counts (SAMPLE_UNITS)."""
        return SAMPLE_UNITS.get(self.method, "pairs")

    @property
    def seen(self) -> int:
        return max(self.n_available, self.n_pairs)

    def interval_text(self, digits: int = 3, decided: bool = False) -> str:
        if self.method == "exact":
            return "exact"
        paired = self.method == "paired"
        return bound_text(self.ratio, self.lo, self.hi, self.n_pairs, self.unit,
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
        optional = {k: None if d.get(k) is None else float(d[k])
                    for k in ("lo", "hi", "pair_cv", "run_cv", "run_cv_reference", "df")}
        counts = {k: int(d.get(k, 0)) for k in ("n_reference", "max_pairs", "n_available")}
        return cls(ratio=float(d["ratio"]), level=float(d["level"]), method=d["method"], n_pairs=int(d["n_pairs"]),
                   next_look=None if d.get("next_look") is None else int(d["next_look"]), **optional, **counts)


@dataclass(frozen=True)
class Verdict:
    """What the core decided for one quantity: outcome against `limit` in `direction`, and why."""

    outcome: str  # pass | fail | inconclusive
    limit: float
    direction: str  # the good side of the limit: at_most (<=), at_least (>=), above (>)
    estimate: Estimate
    reason: str
    stopped: str = ""  # why no more pairs were run ("decided", "max 12 pairs", "wall-clock budget 300 s")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

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
    """confidence: of the repeated intervals (two-sided, simultaneous over the looks); max_pairs: the last planned
    look; first_look: the first (the test's repeats)."""

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


def _logs(values: Sequence[float], what: str) -> list[float]:
    if any(not (v > 0) or math.isinf(v) for v in values):
        raise ValueError(f"{what}: ratios need positive, finite values, got {list(values)!r}")
    return [math.log(v) for v in values]


def _mean_var(xs: Sequence[float]) -> tuple[float, float]:
    """Mean and sample variance in floats (statistics.variance is exact and slow; this runs per look)."""
    n = len(xs)
    mean = math.fsum(xs) / n
    return mean, (math.fsum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0)


def _interval(mean: float, se: float, df: float, nominal: float | None) -> tuple[float | None, float | None]:
    """The interval at one side's `nominal` level; None: before the first look, unbounded unless se is 0."""
    if se == 0.0:
        return math.exp(mean), math.exp(mean)
    if nominal is None:
        return None, None
    half = t_upper_inv(nominal, df) * se
    lo, hi = mean - half, mean + half
    # exp() of a huge half-width overflows: an interval wider than a factor 1e300 is unbounded anyway
    return (math.exp(lo) if lo > -690 else None), (math.exp(hi) if hi < 690 else None)


def _common(design: Design, method: str, mean: float, n: int, m: int, a: Sequence[float], b: Sequence[float],
            seen: int, look: int) -> dict[str, Any]:
    return dict(ratio=math.exp(mean), level=design.confidence, method=method, n_pairs=n, n_reference=m,
                run_cv=relative_spread(a), run_cv_reference=relative_spread(b), max_pairs=design.max_pairs,
                n_available=seen, next_look=design.next_look(seen) if look else design.looks[0])


def paired(a: Sequence[float], b: Sequence[float], design: Design = Design()) -> Estimate:
    """A/B from interleaved pairs (a_i, b_i): geometric mean of the pair ratios, with its repeated interval at the
    planned look the pairs have reached, over that look's pairs (decide/sequential.py's docstring says why)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired estimate needs equal, non-empty samples (got {len(a)} and {len(b)})")
    seen = len(a)
    look = design.look_at(seen)
    n = look or seen  # before the first look: every pair, for the point estimate
    a, b = list(a[:n]), list(b[:n])
    d = [x - y for x, y in zip(_logs(a, "A"), _logs(b, "B"))]
    mean, var = _mean_var(d)
    common = _common(design, "paired", mean, n, n, a, b, seen, look)
    if n < 2:
        return Estimate(lo=None, hi=None, **common)
    sd = math.sqrt(var)  # 0: every pair the same ratio (a deterministic metric): the point, at any look
    lo, hi = _interval(mean, sd / math.sqrt(n), n - 1, design.level("paired", look) if look else None)
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
    common = _common(design, "unpaired", mean, n, m, candidate, reference, seen, look)
    if n < 2 or m < 2:
        # A side with one run has no variance of its own. Only a metric that has shown none on the other
        # side (CUDA peak allocated: the same bytes every run) is decided; anything else stays unbounded.
        if max(n, m) >= 2 and (vy if n >= 2 else vx) == 0.0:
            return Estimate(lo=math.exp(mean), hi=math.exp(mean), **common)
        return Estimate(lo=None, hi=None, **common)
    df = float(min(n, m) - 1)
    lo, hi = _interval(mean, math.sqrt(vy / n + vx / m), df, design.level("unpaired", look, m) if look else None)
    return Estimate(lo=lo, hi=hi, df=df, **common)


def unpaired_resolution(reference: Sequence[float], n: int, design: Design = Design()) -> float | None:
    """How far the unpaired interval reaches each side of its ratio, as a factor, after `n` candidate runs as
    spread as these stored runs: a candidate then fails a limit L only above L x factor, and passes only below
    L / factor. None when the stored runs have fewer than 2 runs or n reaches no look; 1.0 without any spread."""
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


def decide(estimate: Estimate, limit: float, direction: str = "at_most") -> Verdict:
    """PASS when the interval lies within the limit, FAIL when it lies beyond it, INCONCLUSIVE otherwise."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if estimate.method == "exact" and math.isnan(estimate.ratio):
        # NaN compares false both ways: the tests below would hold it neither within nor beyond the limit
        return Verdict(FAIL, limit, direction, estimate, f"nan vs {limit:.3g}: not a number, never within a limit")
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
