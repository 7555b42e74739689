"""The regression verdict against a stored baseline, per metric, and what a saved baseline lets it decide.

Time and memory are decided by the decision core on the candidate's runs against the stored runs (unpaired: the
stored runs are fixed), against a floor T the interval must clear, not a multiple of the noise: FAIL when the whole
interval lies beyond 1 + T, PASS when within it, "improved" when beyond 1 / (1 + T) on the better side. Memory's
floor is max(memory_threshold, memory_floor / baseline) on the device's memory figure. Counts are exact. No
baseline reads "new"; a changed configuration "not comparable", never a regression. The functions are pure.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Mapping

from pytest_distperf.store.baselines import MetricSeries
from pytest_distperf.decide import decision
from pytest_distperf.decide.decision import FAIL, INCONCLUSIVE, Design
from pytest_distperf.figures.explain import Explanation
from pytest_distperf.figures.quantities import WORK_METRICS, memory_metric, secondary_memory_metric, secondary_words
from pytest_distperf.decide.policy import Policy
from pytest_distperf.figures.units import fmt_bytes, fmt_pct, fmt_value
from pytest_distperf.figures.wording import bound_text, is_words

STATUSES = ("pass", "fail", "inconclusive", "improved", "new", "not comparable")


@dataclass
class MetricVerdict:
    """One metric of one job against its baseline: a record for messages, reports and JUnit."""

    test: str
    job: str
    metric: str
    metric_kind: str  # time | memory | count
    unit: str
    direction: str  # lower | higher is better
    status: str  # STATUSES
    baseline: float | None = None  # the job's figure over the stored runs
    current: float | None = None
    baseline_cv: float | None = None  # run-to-run: sd of the log run values
    current_cv: float | None = None
    baseline_runs: int = 0  # the runs behind the figure (a count: the runs that counted it)
    current_runs: int = 0
    # The job's runs on each side (0: not known, as many as the figure's): a count is measured in the first run of each
    # run list of a job only (rank/work.py), so its figure stands on fewer runs than the job has.
    baseline_job_runs: int = 0
    current_job_runs: int = 0
    delta: float | None = None  # current/baseline - 1
    low: float | None = None  # the interval of delta (None: unbounded or exact)
    high: float | None = None
    level: float | None = None
    threshold: float | None = None  # the relative limit the interval must clear
    threshold_text: str = ""
    stopped: str = ""  # why the candidate got no more runs
    next_look: int | None = None  # 0: the last was reached
    note: str = ""

    fails: bool = False  # set as the test lands (`landed`), never while saving
    reference: str = ""  # head vs base: "head abc1234 vs base def5678"
    head_commit: str | None = None
    base_commit: str | None = None
    baseline_values: tuple[float, ...] = ()  # the stored runs' values
    baseline_samples: tuple[tuple[float, ...], ...] = ()  # a time metric's: each stored run's per-step values
    secondary: str = ""  # a figure shown beside this one, never decided on, in words
    explanation: dict[str, Any] | None = None  # what changed (Explanation.to_json), where explained

    def landed(self, policy: Policy, enforced: bool = True) -> "MetricVerdict":
        return replace(self, fails=enforced and is_failing(self, policy))

    def interval_text(self) -> str:
        """'[+7.9%, +11.7%]', words where it cannot be bounded, '-' for a count or a verdict without an interval."""
        if self.metric_kind == "count" or (self.low is None and self.high is None and self.level is None):
            return "-"
        low, high = self.low, self.high
        # a verdict whose runs stopped (a budget, another figure's failure) gets no next look: none is said
        next_look = self.next_look if self.stopped in ("", "decided") else None
        return bound_text(1.0 + (self.delta or 0.0), None if low is None else 1.0 + low,
                          None if high is None else 1.0 + high, self.current_runs, "runs", self.current_cv,
                          "run-to-run", next_look, delta=True, decided=self.status in ("pass", "fail", "improved"))

    def to_json(self) -> dict[str, Any]:
        return {"kind": "baseline", **asdict(self), "interval_text": self.interval_text()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "MetricVerdict":
        if d.get("status") not in STATUSES:
            raise ValueError(f"baseline verdict: status must be one of {STATUSES}, got {d.get('status')!r}")
        names = set(cls.__dataclass_fields__)
        v = cls(**{k: val for k, val in d.items() if k in names})
        v.baseline_values = tuple(float(x) for x in v.baseline_values or ())
        v.baseline_samples = tuple(tuple(float(x) for x in s) for s in v.baseline_samples or ())
        return v


def decide_metric(test: str, job: str, metric: str, baseline: MetricSeries | None, current: MetricSeries,
                  policy: Policy, design: Design = Design(), paired: bool = False) -> MetricVerdict:
    """`paired`: the runs of `current` and `baseline` are interleaved pairs (head vs base)."""
    v = MetricVerdict(test=test, job=job, metric=metric, metric_kind=current.kind, unit=current.unit,
                direction=current.direction, status="new", current=current.center, current_cv=current.variation,
                current_runs=len(current.runs))
    if baseline is None:
        v.note = "no baseline value for this metric"
        return v
    v.baseline, v.baseline_cv, v.baseline_runs = baseline.center, baseline.variation, len(baseline.runs)
    v.baseline_values = tuple(baseline.runs)
    v.baseline_samples = tuple(tuple(s) for s in baseline.samples or ())
    if baseline.center:
        v.delta = current.center / baseline.center - 1
    if current.kind == "count":
        _decide_count(v, baseline, current, "the base" if paired else "the baseline")
    elif any(x <= 0 for x in (*baseline.runs, *current.runs)) and current.kind == "time":
        v.status, v.note = "inconclusive", "non-positive times cannot be compared"
    else:
        t, v.threshold_text = limit_of(baseline, policy, metric)
        _decide_interval(v, baseline, current, t, design, paired)
    return v


def job_runs(series: Mapping[str, MetricSeries]) -> int:
    """How many runs a job's figures come from: its most-measured figure's (step time is measured in every run)."""
    return max((len(s.runs) for s in series.values()), default=0)


def set_job_runs(verdicts: list[MetricVerdict], reference: Mapping[str, MetricSeries],
                 current: Mapping[str, MetricSeries]) -> None:
    """Each verdict's job run counts, so a count measured in fewer runs says how many the job had."""
    for v in verdicts:
        v.current_job_runs = job_runs(current)
        if v.baseline_runs:
            v.baseline_job_runs = job_runs(reference)


def job_metrics(current: dict[str, MetricSeries], policy: Policy, device: str | None) -> list[str]:
    """The metrics of a job the gate decides, in order: those the policy gates, less the device's secondary memory
    figure, which rides on the memory verdict instead (secondary_text)."""
    secondary = secondary_memory_metric(device) if device else None
    return [name for name in current if name != secondary and policy.gates(name, device)]


def secondary_text(metric: str, device: str | None, reference: Mapping[str, MetricSeries],
                   current: Mapping[str, MetricSeries], sides: tuple[str, str] = ("baseline", "current")) -> str:
    """For the verdict of the device's memory figure: its secondary figure, reference and current, in words."""
    secondary = secondary_memory_metric(device) if device else None
    if secondary is None or metric != memory_metric(device or "") or secondary not in current:  # type: ignore[arg-type]
        return ""
    cur, reference = current[secondary].center, reference.get(secondary)
    values = f"{sides[1]} {fmt_bytes(cur)}"
    if reference is not None and reference.runs:
        values = (f"{sides[0]} {fmt_bytes(reference.center)}, {values}"
                  + (f" ({fmt_pct(cur / reference.center - 1)})" if reference.center else ""))
    return f"{secondary_words(secondary, device or 'cpu')}: {values}"


def limit_of(baseline: MetricSeries, policy: Policy, metric: str = "step_time") -> tuple[float, str]:
    if baseline.kind == "time":
        name, what = (("work_threshold", "the smallest change in the step's work worth failing for")
                      if metric in WORK_METRICS else ("time_threshold", "the smallest slowdown worth failing for"))
        t = getattr(policy, name)
        return t, f"+{t:.1%} ({name}: {what})"
    floor = policy.memory_floor / baseline.center if baseline.center > 0 else math.inf
    t = max(policy.memory_threshold, floor)
    return t, (f"max({policy.memory_threshold:.0%}, {fmt_bytes(policy.memory_floor)}) = "
               f"+{fmt_bytes(t * baseline.center)}")


@dataclass
class DetectableChange:
    """What a saved baseline lets the gate decide for one time or memory metric, against as many candidate runs
    as the budget allows, spread as the stored runs are."""

    job: str
    metric: str
    runs: int
    run_cv: float | None
    candidate_runs: int
    limit: float  # relative: +5 % is 0.05
    factor: float | None  # the interval's reach each side of the ratio; None: too few runs for one
    test: str = ""  # saved_as
    file: str = ""

    @property
    def fails_above(self) -> float | None:
        return None if self.factor is None else (1.0 + self.limit) * self.factor - 1.0

    @property
    def can_pass(self) -> bool:
        return self.factor is not None and self.factor <= 1.0 + self.limit

    def text(self) -> str:
        spread = f"run-to-run {self.run_cv:.1%}" if self.run_cv is not None else "no run-to-run spread yet"
        head = f"{self.job}: {self.metric} recorded over {self.runs} run(s), {spread}"
        if self.factor is None:
            return f"{head}: too few runs for an interval, so no verdict can be decided against it"
        fails = (f"a change fails above {self.fails_above_text()}"
                 if self.fails_above <= FAILS_ABOVE_CAP  # type: ignore[operator]
                 else f"only a change of more than {fmt_pct(FAILS_ABOVE_CAP)} could fail (in effect, none)")
        return (f"{head}: against {self.candidate_runs} run(s) as spread, {fails}" + ("" if self.can_pass else
                f", and an unchanged job cannot pass the +{self.limit:.1%} limit (the interval reaches ×/÷"
                f"{self.factor_text()} each side)"))

    def fails_above_text(self) -> str:
        x = self.fails_above
        return "-" if x is None else (f"> {fmt_pct(FAILS_ABOVE_CAP)}" if x > FAILS_ABOVE_CAP else fmt_pct(x))

    def factor_text(self) -> str:
        return "-" if self.factor is None else (">1000" if self.factor > 1000 else f"{self.factor:.2f}")

    def saved_as(self, test: str, path: str) -> "DetectableChange":
        return replace(self, test=test, file=path)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "baseline_saved", **asdict(self), "fails_above": self.fails_above, "can_pass": self.can_pass,
                "fails_above_text": self.fails_above_text(), "factor_text": self.factor_text()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "DetectableChange":
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


# Past +1000 % the smallest failing change says only "no realistic change can fail": shown as "> +1000%".
FAILS_ABOVE_CAP = 10.0


def detectable_changes(job: str, metrics: dict[str, MetricSeries], policy: Policy, design: Design,
                device: str | None = None) -> list[DetectableChange]:
    """The gated time and memory metrics of a job about to be saved, each with what it will let the gate decide."""
    out = []
    for name in job_metrics(metrics, policy, device):
        series = metrics[name]
        if series.kind == "count" or not series.runs:
            continue
        limit, _ = limit_of(series, policy, name)
        out.append(DetectableChange(job=job, metric=name, runs=len(series.runs), run_cv=series.variation,
                              candidate_runs=design.max_pairs, limit=limit, factor=_reach(series, design)))
    return out


def _positive(runs: list[float]) -> list[float]:
    """Run values as the interval takes them: a memory growth of 0 is kept as a tiny positive value."""
    return [max(x, 1.0e-300) for x in runs]


def _reach(baseline: MetricSeries, design: Design) -> float | None:
    return decision.unpaired_resolution(_positive(baseline.runs), design.max_pairs, design)


def _worse(est: decision.Estimate, direction: str) -> decision.Estimate:
    """The estimate as 'worse by this factor': current/baseline when lower is better, its inverse otherwise."""
    if direction == "lower":
        return est
    return replace(est, ratio=1.0 / est.ratio, lo=None if est.hi is None else 1.0 / est.hi,
                   hi=None if not est.lo else 1.0 / est.lo)


def _decide_interval(v: MetricVerdict, b: MetricSeries, c: MetricSeries, t: float, design: Design,
                     paired: bool = False) -> None:
    """Time and memory: the core's interval of current/baseline against 1 + t (and 1/(1 + t))."""
    est = (decision.paired if paired else decision.unpaired)(_positive(c.runs), _positive(b.runs), design)
    v.delta, v.level, v.threshold, v.next_look = est.ratio - 1, est.level, t, est.next_look
    v.low = None if est.lo is None else est.lo - 1
    v.high = None if est.hi is None else est.hi - 1
    worse = _worse(est, c.direction)
    runs = (f"{len(c.runs)} interleaved pairs" if paired
            else f"{len(c.runs)} current against {len(b.runs)} stored run(s)")
    verdict = decision.decide(worse, 1.0 + t)
    if verdict.outcome == FAIL:
        v.status, v.note = "fail", f"worse by more than the limit over the whole interval ({runs})"
    elif verdict.outcome == INCONCLUSIVE:
        v.status = "inconclusive"
        v.note = (f"the interval holds the limit ({runs})" if not worse.unbounded
                  else f"too few runs for an interval ({runs}): a side with one run has no variation")
        reach = None if paired else _reach(b, design)
        if reach is not None and reach > 1.0 + t and b.variation is not None:  # the stored runs keep it undecided
            v.note += (f"; the stored runs' spread ({b.variation:.1%} run-to-run over {len(b.runs)}) "
                       f"lets no unchanged job pass within {design.max_pairs} runs: record the baseline again on a "
                       f"quieter machine or with more runs")
    elif decision.decide(worse, 1.0 / (1.0 + t), "at_least").outcome == FAIL:
        v.status = "improved"
        v.note = f"better by more than the limit over the whole interval ({runs})" + (
            "" if paired else ": refresh the baseline")
    else:
        v.status = "pass"
        if worse.lo is not None and worse.lo > 1.0:  # a floor (memory_floor) can pass what its percentage would not
            v.note = f"worse over the whole interval, within the limit {v.threshold_text} ({runs})"


def _decide_count(v: MetricVerdict, b: MetricSeries, c: MetricSeries, reference: str = "the baseline") -> None:
    """Exact: the worst of the current runs against the reference's value (the median of its runs)."""
    v.threshold, v.threshold_text = 0.0, "exact"
    sign = 1.0 if c.direction == "lower" else -1.0
    worst = max(c.runs, key=lambda x: sign * x)
    worse = sign * (worst - b.center)
    v.current = worst
    v.delta = worst / b.center - 1 if b.center else None
    if worse > 0:
        v.status, v.note = "fail", f"differs from {reference} (counts must match exactly)"
    elif worse < 0:
        v.status, v.note = "improved", f"better than {reference}" + (
            ": refresh the baseline" if reference == "the baseline" else "")
    else:
        v.status = "pass"
    if len(set(c.runs)) > 1:
        v.note = (v.note + "; " if v.note else "") + "the count varies between runs"


def is_pending(v: MetricVerdict) -> bool:
    """A verdict more runs of the candidate could decide."""
    return v.status == "inconclusive" and v.metric_kind in ("time", "memory")


def is_failing(v: MetricVerdict, policy: Policy) -> bool:
    return (v.status == "fail" or (v.status == "improved" and policy.fail_on_improvement)
            or (v.status in ("new", "not comparable") and policy.require_baseline)
            or (v.status == "inconclusive" and policy.strict))


def _runs(n: int) -> str:
    return f"{n} run{'s' if n != 1 else ''}"


def _with_spread(value: float | None, cv: float | None, runs: int, unit: str, kind: str, job_runs: int = 0,
                 center: str = "worst") -> str:
    """The figure with the runs behind it. A count: `center` ("worst" of the candidate's runs, "median" of the
    reference's) of the runs that counted it, and the job's runs where it had more (counts are measured in the
    first run of each run list of a job only)."""
    text = fmt_value(value, unit)
    if kind == "count":
        if job_runs > runs:
            counted = "the first" if runs == 1 else f"{center} of {runs}"
            return f"{text} (counted in {counted} of {job_runs} runs)"
        return f"{text} ({f'{center} of ' if runs > 1 else ''}{_runs(runs)})"
    spread = f", run-to-run {cv:.1%}" if cv is not None else ""
    return f"{text} (geometric mean of {_runs(runs)}{spread})"


def failure_lines(failing: list[MetricVerdict], policy: Policy,
                  sides: tuple[str, str] = ("baseline", "current")) -> list[str]:
    """Each failing verdict's lines, indented; a job's what-changed diff (all its verdicts carry the same) once."""
    lines, seen = [], set()
    for v in failing:
        shown = replace(v, explanation=None) if v.job in seen else v
        lines += ["  " + line for line in describe_verdict(shown, policy, sides)]
        seen.add(v.job)
    return lines


def describe_verdict(v: MetricVerdict, policy: Policy, sides: tuple[str, str] = ("baseline", "current")) -> list[str]:
    """The lines of a failure message for one verdict; `sides` names its reference and candidate."""
    head = f"{v.job}: {v.metric} {v.status.upper()}"
    current = _with_spread(v.current, v.current_cv, v.current_runs, v.unit, v.metric_kind, v.current_job_runs)
    if v.status in ("new", "not comparable"):
        why = " (--distperf-require-baseline)" if policy.require_baseline else ""
        return [f"{head}: {v.note}{why}; current {current}"]
    text = v.interval_text()
    interval = ("" if v.level is None else f": {text}" if is_words(text) else f", {v.level:.0%} interval {text}")
    width = max(map(len, sides))
    reference = _with_spread(v.baseline, v.baseline_cv, v.baseline_runs, v.unit, v.metric_kind, v.baseline_job_runs,
                             "median")  # a count's reference figure is the median of its runs
    lines = [f"{head}: {fmt_pct(v.delta)} vs {sides[0]}{interval}; limit {v.threshold_text}",
             f"  {sides[0]:<{width}} {reference}", f"  {sides[1]:<{width}} {current}"]
    if v.note:
        stopped = v.status == "inconclusive" and v.stopped not in ("", "decided")  # why it stayed undecided
        lines.append(f"  {v.note}" + (f"; stopped: {v.stopped}" if stopped else ""))
    if v.secondary:
        lines.append(f"  {v.secondary}")
    if v.status == "inconclusive" and policy.strict:
        lines.append("  (an inconclusive verdict fails because of --distperf-strict)")
    if v.status == "improved":
        lines.append("  (an improvement fails only because distperf_fail_on_improvement is set)")
    if v.explanation:
        lines += ["  " + line for line in Explanation.from_json(v.explanation).lines(sides)]
    return lines


def property_text(v: MetricVerdict) -> str:
    return (f"{v.status} {fmt_pct(v.delta)} baseline={fmt_value(v.baseline, v.unit)} "
            f"current={fmt_value(v.current, v.unit)}")
