"""Ratio checks between two strategies: "A within k x of B" for step time, memory, GPU time, FLOPs and losses.

A Comparison holds both sides' interleaved runs (A B, then B A, ...) and decides each check with the decision core
into a Check record, which messages, tables, reports and JUnit read. While a check is INCONCLUSIVE the comparison
adds interleaved pairs up to the design's next planned look (`Adaptive.extend`), until decided or out of budget;
an INCONCLUSIVE that stays warns (or fails with --distperf-strict); only a FAIL raises DistPerfCheckFailed.
"""

from __future__ import annotations

import itertools
import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from pytest_distperf.errors import DistPerfCheckFailed, DistPerfInconclusive, UsageError, warn
from pytest_distperf.decide import decision, stopping
from pytest_distperf.decide.decision import FAIL, INCONCLUSIVE, PASS, Design
from pytest_distperf.decide.stopping import Budget, Clock
from pytest_distperf.figures.quantities import (WORK_METRICS, JobRuns, breakdown_lines, geometric_mean, memory_metric,
                                             memory_words, run_peak_memory, run_step_time, run_work,
                                             secondary_memory_metric, secondary_words, work_not_measured)
from pytest_distperf.figures.stats import first_non_finite, max_relative_difference, relative_spread
from pytest_distperf.figures.units import fmt_bytes, fmt_seconds
from pytest_distperf.figures.wording import bound_text, is_words


@dataclass
class Check:
    """One decided check. ratio/low/high: A/B and its interval (None: unbounded; exact checks have none)."""

    name: str  # "step_time", "peak_memory" / "train_memory" (the memory figure that decided), "loss_match", ...
    a: str
    b: str
    a_value: float
    b_value: float
    ratio: float
    low: float | None
    high: float | None
    threshold: float
    outcome: str  # pass | fail | inconclusive (decision.OUTCOMES)
    unit: str  # "s", "bytes", "rel", "count", "frac"
    level: float | None = None
    method: str = "exact"  # decision.METHODS
    pairs: int = 1
    pair_cv: float | None = None  # sd of the pairs' log ratios
    run_cv_a: float | None = None  # run-to-run: sd of each side's log run values
    run_cv_b: float | None = None
    stopped: str = ""  # why no more pairs were run
    reason: str = ""
    next_look: int | None = None  # 0: the last was reached; None: not said
    secondary: str = ""  # a figure shown beside the one that decided, never decided on, in words

    @property
    def passed(self) -> bool:
        return self.outcome == PASS

    @classmethod
    def from_verdict(cls, name: str, a: str, b: str, a_value: float, b_value: float, unit: str,
                     v: decision.Verdict, **extra: Any) -> "Check":
        e = v.estimate
        return cls(name=name, a=a, b=b, a_value=a_value, b_value=b_value, ratio=e.ratio,
                   low=None if e.method == "exact" else e.lo, high=None if e.method == "exact" else e.hi,
                   threshold=v.limit, outcome=v.outcome, unit=unit, level=e.level, method=e.method, pairs=e.n_pairs,
                   pair_cv=e.pair_cv, run_cv_a=e.run_cv, run_cv_b=e.run_cv_reference, stopped=v.stopped,
                   reason=v.reason, next_look=e.next_look, **extra)

    def interval_text(self) -> str:
        if self.method == "exact":
            return "exact"
        if self.method not in ("paired", "unpaired"):
            return "-"
        paired = self.method == "paired"
        return bound_text(self.ratio, self.low, self.high, self.pairs, "pairs" if paired else "runs",
                          self.pair_cv if paired else self.run_cv_a, "pair-to-pair" if paired else "run-to-run",
                          self.next_look, decided=self.outcome in (PASS, FAIL))

    def to_json(self) -> dict[str, Any]:
        # Strict JSON has no NaN or inf (a loss that went NaN): null, read back as NaN
        d = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in asdict(self).items()}
        return {"kind": "check", **d, "passed": self.passed, "interval_text": self.interval_text()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Check":
        names = set(cls.__dataclass_fields__)
        values = {k: v for k, v in d.items() if k in names}
        for k in _NUMBERS:
            if k in values and values[k] is None:
                values[k] = math.nan
        return cls(**values)


_NUMBERS = ("a_value", "b_value", "ratio", "threshold")  # a Check's figures that are never None


@dataclass
class Adaptive:
    """How a comparison may grow while a check is INCONCLUSIVE, and what an INCONCLUSIVE that stays does."""

    extend: Callable[[], None] | None = None  # runs one more interleaved pair onto both sides' (shared) runs
    budget: Budget = field(default_factory=Budget)
    clock: Clock = field(default_factory=Clock)
    progress: Callable[[str], None] | None = None
    on_inconclusive: Callable[[Check, str], None] | None = None  # default: a DistPerfInconclusive warning


def warn_inconclusive(check: Check, message: str) -> None:
    warn(DistPerfInconclusive(message))


def _step_times(side: JobRuns) -> list[float]:
    return [run_step_time(r) for r in side.runs]


def _step_line(side: JobRuns) -> str:
    f = side.figures
    cv = f" (run-to-run {f.run_cv:.1%})" if f.run_cv is not None else ""
    return (f"{side.label}: step time {fmt_seconds(f.step_time)}{cv}, steps p10 {fmt_seconds(f.step_p10)} - "
            f"p90 {fmt_seconds(f.step_p90)}, over {f.runs} run(s) x {f.steps} steps")


def _work(side: JobRuns, metric: str) -> list[float]:
    """One value per run of a work figure; skips the test where a run has none. An exact count is measured in the
    first run of each run list of a job only (rank/work.py): its values are those of the runs that measured it."""
    values = [run_work(r).get(metric) for r in side.runs]
    if WORK_METRICS.get(metric, ("", ""))[1] == "count":
        values = [v for v in values if v is not None] or [None]
    if any(v is None for v in values):
        field_name = WORK_METRICS[metric][0] if metric in WORK_METRICS else metric
        why = work_not_measured(side.runs).get(field_name, "the job ran no work phase (JobSpec.work_steps 0)")
        import pytest

        pytest.skip(f"{metric} of {side.label}: {why}")
    return [float(v) for v in values]  # type: ignore[arg-type]


def _gpu_line(side: JobRuns) -> str:
    f, times = side.figures, _work(side, "gpu_time")
    share = f", GPU busy {f.gpu_busy_share:.0%} of the step" if f.gpu_busy_share is not None else ""
    cv = relative_spread(times)
    spread = f" (run-to-run {cv:.2%})" if cv is not None else ""
    return (f"{side.label}: GPU kernel time {fmt_seconds(f.work['gpu_time'])}{spread} a step{share}, "
            f"wall step time {fmt_seconds(f.step_time)}, over {f.runs} run(s)")


def _memories(side: JobRuns, metric: str) -> list[float]:
    """One value per run of a memory figure (`train_memory` skips the test where a run has none)."""
    return [run_peak_memory(r) for r in side.runs] if metric == "peak_memory" else _work(side, metric)


def _memory(side: JobRuns, metric: str) -> float:
    return side.figures.peak_memory if metric == "peak_memory" else geometric_mean(_work(side, metric))


def _memory_line(side: JobRuns, metric: str) -> str:
    mems = _memories(side, metric)
    return (f"{side.label}: {memory_words(metric, _device(side))} {fmt_bytes(_memory(side, metric))} "
            f"(runs {fmt_bytes(min(mems))} - {fmt_bytes(max(mems))}) over {len(mems)} run(s)")


def _device(side: JobRuns) -> str:
    return side.runs[0].spec.device


def check_limit(method: str, value: Any, zero: bool = False) -> float:
    """A check's limit, checked when the assert_* method is called: a finite number above 0 (`zero`: 0 too). NaN
    passes no comparison (a check against it only ever says inconclusive), a string fails deep inside.

    Not before any job: `distperf.compare(a, b)` runs its first pairs and returns the Comparison, and only then is
    `.assert_step_time_within(k)` called with `k`, so a bad limit is seen after those runs. It is seen before any
    further pair is added (a check that would stay undecided adds pairs, `Adaptive.extend`) and before anything
    is decided or recorded; the error says that the comparison's runs came first."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value)
            or not (value > 0 or (zero and value == 0))):
        what = "a finite number >= 0" if zero else "a finite number > 0"
        name = method if "." in method else "Comparison." + method
        after = ("" if "." in method else
                 " (a limit is known only when the check is called, after distperf.compare() ran the comparison's "
                 "first pairs; no further pair was added)")
        raise UsageError(f"{name}({value!r}): expected {what}, got {value!r}{after}")
    return float(value)


class Comparison:
    """Two jobs' runs, interleaved A B, then B A, ...; each assert_* decides one check on them."""

    def __init__(self, a: JobRuns, b: JobRuns, on_check: Callable[[Check], None] | None = None,
                 adaptive: Adaptive | None = None):
        if len(a.runs) != len(b.runs) or not a.runs:
            raise ValueError("a comparison needs the same, non-zero number of runs on both sides")
        self.a, self.b = a, b
        self.checks: list[Check] = []
        self._on_check = on_check
        self.adaptive = adaptive or Adaptive()

    @property
    def design(self) -> Design:
        return self.adaptive.budget.design()

    def _add(self, check: Check) -> None:
        self.checks.append(check)
        if self._on_check:
            self._on_check(check)

    def _decide(self, values: Callable[[JobRuns], list[float]], limit: float, what: str) -> decision.Verdict:
        """The core's verdict on A/B over the interleaved pairs, adding pairs while INCONCLUSIVE."""

        def look() -> decision.Verdict:
            return decision.decide(decision.paired(values(self.a), values(self.b), self.design), limit)

        sink = self.adaptive.progress  # without `extend` (fixed runs): one look
        return stopping.until_decided(look, self.adaptive.extend, self.adaptive.budget, self.adaptive.clock,
                                      (lambda text: sink(f"{what}: {text}")) if sink else None)

    @property
    def step_time_ratio(self) -> decision.Estimate:
        return decision.paired(_step_times(self.a), _step_times(self.b), self.design)

    def _config_notes(self) -> str:
        a, b = self.a.runs[0], self.b.runs[0]
        line = (f"optimizer state + master weights: {a.optimizer_bytes_per_param:.1f} vs "
                f"{b.optimizer_bytes_per_param:.1f} bytes/param (summed over ranks)")
        if abs(a.optimizer_bytes_per_param - b.optimizer_bytes_per_param) > 0.5:
            line += " -- the sides keep different optimizer precision: a config mismatch, not only a speed gap"
        return line

    def _ratio_check(self, name: str, k: float, values: Callable[[JobRuns], list[float]],
                     value: Callable[[JobRuns], float], unit: str, line: Callable[[JobRuns], str],
                     what: str, secondary: Callable[[], str] | None = None) -> Check:
        __tracebackhide__ = True  # pytest shows the message, not this frame
        v = self._decide(values, k, what)
        check = Check.from_verdict(name, self.a.label, self.b.label, value(self.a), value(self.b), unit, v,
                                   secondary=secondary() if secondary else "")
        self._add(check)
        noise = (f"  pair-to-pair variation {check.pair_cv:.1%}" if check.pair_cv is not None else "  ") + (
            f", run-to-run {check.run_cv_a:.1%} (A) / {check.run_cv_b:.1%} (B)"
            if check.run_cv_a is not None and check.run_cv_b is not None else "")
        interval = (f"  ratio A/B {check.ratio:.3f}, {check.level:.0%} interval {check.interval_text()} over "
                    f"{check.pairs} interleaved pair(s) ({v.stopped}); limit {k:.2f}")
        if v.outcome == FAIL:
            raise DistPerfCheckFailed("\n".join([
                f"{what} of {self.a.label} is {check.ratio:.3f}x {self.b.label}'s, above the {k:.2f}x limit "
                f"(the whole interval is)",
                f"  A {line(self.a)}", f"  B {line(self.b)}", interval, noise.rstrip(), f"  {self._config_notes()}",
                *(breakdown_lines(self.a, self.b) if name == "step_time" else []),  # where the time goes
                *([f"  {check.secondary}"] if check.secondary else []),
            ]), check)
        if v.outcome == INCONCLUSIVE:
            text = check.interval_text()
            held = (f"against the {k:.2f}x limit: {text}" if is_words(text) else
                    f"with the {check.level:.0%} interval {text} holding the {k:.2f}x limit")
            message = "\n".join([
                f"{what} of {self.a.label} vs {self.b.label}: inconclusive, {check.ratio:.3f}x {held} after "
                f"{check.pairs} interleaved pair(s) ({v.stopped})",
                f"  A {line(self.a)}", f"  B {line(self.b)}", noise.rstrip(),
                *([f"  {check.secondary}"] if check.secondary else [])])
            (self.adaptive.on_inconclusive or warn_inconclusive)(check, message)
        return check

    def assert_step_time_within(self, k: float) -> Check:
        """Fail unless A's step time is at most k x B's: decided on the interval of the pair ratios."""
        __tracebackhide__ = True
        k = check_limit("assert_step_time_within", k)
        return self._ratio_check("step_time", k, _step_times, lambda s: s.figures.step_time, "s", _step_line,
                                 "step time")

    def assert_memory_within(self, k: float) -> Check:
        """Fail unless A's memory is at most k x B's: CUDA peak allocated on CUDA; on CPU the training state
        (`train_memory`), with host RSS growth shown beside it, never decided on (it counts imports and one-time
        allocations). The check is named after the figure that decided it. Skips where it was not measured."""
        __tracebackhide__ = True
        k = check_limit("assert_memory_within", k)
        metric = memory_metric(_device(self.a))
        _memories(self.a, metric), _memories(self.b, metric)  # skip before any pair is added
        other = secondary_memory_metric(_device(self.a))
        what = "peak memory" if metric == "peak_memory" else f"training-state memory ({metric})"
        return self._ratio_check(metric, k, lambda s: _memories(s, metric), lambda s: _memory(s, metric), "bytes",
                                 lambda s: _memory_line(s, metric), what,
                                 (lambda: self._secondary_memory(other)) if other else None)

    def _secondary_memory(self, metric: str) -> str:
        a, b = _memory(self.a, metric), _memory(self.b, metric)
        ratio = f", {a / b:.3f}x" if b > 0 else ""
        return f"{secondary_words(metric, _device(self.a))}: A {fmt_bytes(a)}, B {fmt_bytes(b)}{ratio}"

    def assert_gpu_time_within(self, k: float) -> Check:
        """Fail unless A's GPU kernel time per step (compute + memcpy/memset) is at most k x B's: a figure the host's
        noise does not move. Skips where it was not measured (CPU jobs)."""
        __tracebackhide__ = True
        k = check_limit("assert_gpu_time_within", k)
        _work(self.a, "gpu_time"), _work(self.b, "gpu_time")  # skip before any pair is added
        return self._ratio_check("gpu_time", k, lambda s: _work(s, "gpu_time"), lambda s: s.figures.work["gpu_time"],
                                 "s", _gpu_line, "GPU kernel time")

    def assert_flops_within(self, k: float) -> Check:
        """Fail unless A's FLOPs per step are at most k x B's (exact counts: no interval)."""
        __tracebackhide__ = True
        k = check_limit("assert_flops_within", k)
        fa, fb = max(_work(self.a, "flops_per_step")), max(_work(self.b, "flops_per_step"))
        ratio = fa / fb if fb else float("inf")
        return self._exact_check("flops", fa, fb, ratio, k, "FLOP", lambda: (
            f"FLOPs per step of {self.a.label} are {ratio:.4f}x {self.b.label}'s ({fa:.4g} vs {fb:.4g}), above the "
            f"{k:.2f}x limit (exact counts)"))

    def assert_losses_match(self, rtol: float) -> Check:
        """Same seed, same batches: the loss curves of every run of A and every run of B agree within rtol at
        every step (exact: no interval)."""
        __tracebackhide__ = True
        rtol = check_limit("assert_losses_match", rtol, zero=True)
        self._finite_losses(rtol)
        pairs = list(itertools.product(range(len(self.a.runs)), range(len(self.b.runs))))
        diffs = [max_relative_difference(self.a.runs[i].losses, self.b.runs[j].losses) for i, j in pairs]
        worst = max(range(len(pairs)), key=lambda n: diffs[n])
        i, j = pairs[worst]
        la, lb = self.a.runs[i].losses, self.b.runs[j].losses
        return self._exact_check("loss_match", la[-1], lb[-1], diffs[worst], rtol, "rel", lambda: (
            f"losses of {self.a.label} and {self.b.label} differ by {diffs[worst]:.2e} (relative), above "
            f"{rtol:.1e} (worst of {len(pairs)} run pair(s): A run {i + 1}, B run {j + 1})\n"
            f"  A: {[round(x, 5) for x in la]}\n  B: {[round(x, 5) for x in lb]}"))

    def _finite_losses(self, rtol: float) -> None:
        """Fail where a side's loss went NaN or inf: no relative difference to it lies within any tolerance (and
        max() over NaN differences kept whichever came first). Names each such side's first run and step."""
        __tracebackhide__ = True
        lines = []
        for name, side in (("A", self.a), ("B", self.b)):
            for n, run in enumerate(side.runs):
                step = first_non_finite(run.losses)
                if step is not None:
                    lines += [f"  {name} ({side.label}) run {n + 1}: loss {run.losses[step]} at timed step {step + 1} "
                              f"of {len(run.losses)}, its first non-finite one",
                              f"    {[round(x, 5) for x in run.losses]}"]
                    break
        if lines:
            la, lb = self.a.runs[0].losses, self.b.runs[0].losses
            self._exact_check("loss_match", la[-1] if la else math.nan, lb[-1] if lb else math.nan, math.nan, rtol,
                              "rel", lambda: "\n".join([
                                  f"losses of {self.a.label} and {self.b.label} cannot match within {rtol:.1e}: a "
                                  f"loss is not finite (NaN or inf)", *lines]))

    def _exact_check(self, name: str, a_value: float, b_value: float, value: float, limit: float, unit: str,
                     failure: Callable[[], str]) -> Check:
        """An exact value against its limit: PASS or FAIL, never INCONCLUSIVE (a NaN value FAILs: decision.decide)."""
        __tracebackhide__ = True
        v = decision.decide(decision.exact(value), limit)
        check = Check.from_verdict(name, self.a.label, self.b.label, a_value, b_value, unit, v)
        self._add(check)
        if v.outcome == FAIL:
            raise DistPerfCheckFailed(failure(), check)
        return check
