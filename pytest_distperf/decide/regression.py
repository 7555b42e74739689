"""The regression verdict against a stored baseline, per metric, and the per-test gate that applies it.

Every time and memory verdict comes from the decision core (decide/decision.py): the candidate's runs
against the stored runs, unpaired (the stored runs are fixed; only the candidate grows), with the core's
98 % repeated interval of current/baseline. Per metric ("worse" follows the metric's direction):
- time: FAIL when the whole interval lies beyond 1 + T, T the smallest slowdown worth failing for
  (`time_threshold`, default 5 %, per test through the marker): T is a floor the interval must clear,
  not a multiple of the noise. PASS when the interval lies within 1 + T; INCONCLUSIVE while it holds it.
- memory: the same, with T = max(memory_threshold (2 %), memory_floor (64 MiB) / baseline).
- counts (collectives, optimizer state bytes): exact.
- an improvement (the whole interval beyond 1 / (1 + T) on the better side) reads "improved -- refresh the
  baseline" and fails only with --distperf-fail-on-improvement.
- no baseline (file, job or metric): "new" -- a failure only with --distperf-require-baseline; a job
  whose configuration hash changed: "not comparable", never "regression".
While a time or memory verdict is INCONCLUSIVE the gate runs the job again (adaptive repeats, up to the
test's budget); what stays INCONCLUSIVE warns (DistPerfInconclusive), or fails with --distperf-strict.

The decision functions are pure; BaselineGate (one per test) holds the baseline file, extends a job's
runs while undecided, decides on all the runs when the test ends and lands the outcome (or the saved
file, for which it records each job up to the budget's runs: the stored runs bound what later verdicts
can resolve).
"""

from __future__ import annotations

import math
import os
import shlex
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from pytest_distperf.errors import (BaselineEnvironmentWarning, BaselineNoisyWarning, BaselineReplacedWarning,
                                    BaselineUnmatchedWarning, DistPerfInconclusive)
from pytest_distperf.launch import fingerprint
from pytest_distperf.store.document import job_to_dict
from pytest_distperf.store.baselines import (BaselineError, BaselineFile, BaselineReplaceable, JobEntry, MetricSeries,
                                             Store, job_identity, metrics_from_runs, now_iso)
from pytest_distperf.decide import decision
from pytest_distperf.decide.decision import FAIL, INCONCLUSIVE, Budget, Clock, Design
from pytest_distperf.measure.figures import WORK_METRICS, JobFigures, job_figures
from pytest_distperf.spec.job import JobSpec
from pytest_distperf.rank.results import RunResult
from pytest_distperf.decide.policy import GateSettings, Policy
from pytest_distperf.measure.units import fmt_bytes, fmt_pct, fmt_value
from pytest_distperf.measure.wording import fmt_interval, is_words

STATUSES = ("pass", "fail", "inconclusive", "improved", "new", "not comparable")


@dataclass
class MetricVerdict:
    """One metric of one job against its baseline: a record for messages, reports and JUnit (to/from JSON)."""

    test: str
    job: str
    metric: str
    metric_kind: str  # time | memory | count
    unit: str
    direction: str  # lower | higher is better
    status: str  # STATUSES
    baseline: float | None = None  # the job's figure over the stored runs (measure/figures: geometric mean)
    current: float | None = None
    baseline_cv: float | None = None  # run-to-run: sd of the log run values
    current_cv: float | None = None
    baseline_runs: int = 0
    current_runs: int = 0
    delta: float | None = None  # current/baseline - 1 (the ratio of the geometric means)
    low: float | None = None  # the interval of delta (None: unbounded or exact)
    high: float | None = None
    level: float | None = None  # of the interval
    threshold: float | None = None  # the relative limit the interval must clear
    threshold_text: str = ""
    stopped: str = ""  # why the candidate got no more runs
    next_look: int | None = None  # the design's next planned look in candidate runs (0: the last was reached)
    note: str = ""

    def to_record(self, policy: Policy, enforced: bool = True) -> dict[str, Any]:
        """A plain record for reports; `fails`: whether this verdict fails the test (never while saving)."""
        record = asdict(self)
        return {"kind": "baseline", **record, "fails": enforced and is_failing(self, policy),
                "interval_text": fmt_interval(record)}  # the words every report uses (report/wording.bound_text)

    @classmethod
    def from_record(cls, d: dict[str, Any]) -> "MetricVerdict":
        if d.get("status") not in STATUSES:
            raise ValueError(f"baseline verdict: status must be one of {STATUSES}, got {d.get('status')!r}")
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


# -- the pure decision ------------------------------------------------------------------------------------------
def decide_metric(test: str, job: str, metric: str, baseline: MetricSeries | None, current: MetricSeries,
                  policy: Policy, design: Design = Design(), paired: bool = False) -> MetricVerdict:
    """`paired`: the runs of `current` and `baseline` are interleaved pairs (head vs base, decide/against.py),
    decided on the paired interval; else the stored runs are fixed and the interval is unpaired."""
    v = MetricVerdict(test=test, job=job, metric=metric, metric_kind=current.kind, unit=current.unit,
                direction=current.direction, status="new", current=current.center, current_cv=current.variation,
                current_runs=len(current.runs))
    if baseline is None:
        v.note = "no baseline value for this metric"
        return v
    v.baseline, v.baseline_cv, v.baseline_runs = baseline.center, baseline.variation, len(baseline.runs)
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


def limit_of(baseline: MetricSeries, policy: Policy, metric: str = "step_time") -> tuple[float, str]:
    """A time or memory metric's relative limit against this baseline, and how reports name it."""
    if baseline.kind == "time" and metric in WORK_METRICS:
        t = policy.work_threshold
        return t, f"+{t:.1%} (work_threshold: the smallest change in the step's work worth failing for)"
    if baseline.kind == "time":
        t = policy.time_threshold
        return t, f"+{t:.1%} (time_threshold: the smallest slowdown worth failing for)"
    floor = policy.memory_floor / baseline.center if baseline.center > 0 else math.inf
    t = max(policy.memory_threshold, floor)
    return t, f"max({policy.memory_threshold:.0%}, {fmt_bytes(policy.memory_floor)}) = +{fmt_bytes(t * baseline.center)}"


@dataclass
class Resolution:
    """What a saved baseline lets the gate decide for one time or memory metric, against as many candidate runs
    as the budget allows, spread as the stored runs are (decision.unpaired_resolution)."""

    job: str
    metric: str
    runs: int
    run_cv: float | None
    candidate_runs: int
    limit: float  # relative: +5 % is 0.05
    factor: float | None  # the interval's reach each side of the ratio; None: too few runs for one

    @property
    def fails_above(self) -> float | None:
        """The smallest change that can FAIL (relative); None: none can."""
        return None if self.factor is None else (1.0 + self.limit) * self.factor - 1.0

    @property
    def can_pass(self) -> bool:
        """Whether an unchanged job can PASS the limit at all: the interval must fit below 1 + limit."""
        return self.factor is not None and self.factor <= 1.0 + self.limit

    def text(self) -> str:
        spread = f"run-to-run {self.run_cv:.1%}" if self.run_cv is not None else "no run-to-run spread yet"
        head = f"{self.job}: {self.metric} recorded over {self.runs} run(s), {spread}"
        if self.factor is None:
            return f"{head}: too few runs for an interval, so no verdict can be decided against it"
        fails = (f"a change fails above {self.fails_above_text()}" if self.fails_above <= FAILS_ABOVE_CAP  # type: ignore[operator]
                 else f"only a change of more than {fmt_pct(FAILS_ABOVE_CAP)} could fail (in effect, none)")
        return (f"{head}: against {self.candidate_runs} run(s) as spread, {fails}" + ("" if self.can_pass else
                f", and an unchanged job cannot pass the +{self.limit:.1%} limit (the interval reaches ×/÷"
                f"{fmt_factor(self.factor)} each side)"))

    def fails_above_text(self) -> str:
        """The smallest change that can fail, for a table cell: '> +1000%' beyond FAILS_ABOVE_CAP ('-': none)."""
        x = self.fails_above
        return "-" if x is None else (f"> {fmt_pct(FAILS_ABOVE_CAP)}" if x > FAILS_ABOVE_CAP else fmt_pct(x))

    def to_record(self, test: str, path: str) -> dict[str, Any]:
        return {"kind": "baseline_saved", "test": test, "file": path, **asdict(self),
                "fails_above": self.fails_above, "can_pass": self.can_pass,
                "fails_above_text": self.fails_above_text(), "factor_text": fmt_factor(self.factor)}


# A few wildly spread runs can make the smallest failing change astronomically large: past +1000 % the figure
# says nothing more than "no realistic change can fail", so it is shown as "> +1000%".
FAILS_ABOVE_CAP = 10.0


def fmt_factor(factor: float | None) -> str:
    return "-" if factor is None else (">1000" if factor > 1000 else f"{factor:.2f}")


def resolutions(job: str, metrics: dict[str, MetricSeries], policy: Policy, design: Design) -> list[Resolution]:
    """The time and memory metrics of a job about to be saved, each with what it will let the gate decide."""
    out = []
    for name, series in metrics.items():
        if series.kind == "count" or not series.runs or not policy.gates(name):
            continue
        limit, _ = limit_of(series, policy, name)
        out.append(Resolution(job=job, metric=name, runs=len(series.runs), run_cv=series.variation,
                              candidate_runs=design.max_pairs, limit=limit, factor=_reach(series, design)))
    return out


def _positive(runs: list[float]) -> list[float]:
    """Run values as the interval takes them: a memory growth of 0 is kept as a tiny positive value."""
    return [max(x, 1.0e-300) for x in runs]


def _reach(baseline: MetricSeries, design: Design) -> float | None:
    """The interval's reach against these stored runs at the budget (decision.unpaired_resolution)."""
    return decision.unpaired_resolution(_positive(baseline.runs), design.max_pairs, design)


def _worse(est: decision.Estimate, direction: str) -> decision.Estimate:
    """The estimate as 'worse by this factor': current/baseline when lower is better, its inverse otherwise."""
    if direction == "lower":
        return est
    return replace(est, ratio=1.0 / est.ratio, lo=None if est.hi is None else 1.0 / est.hi,
                   hi=None if not est.lo else 1.0 / est.lo)


def _decide_interval(v: MetricVerdict, b: MetricSeries, c: MetricSeries, t: float, design: Design,
                     paired: bool = False) -> None:
    """Time and memory: the core's interval of current/baseline against 1 + t (and 1/(1 + t)), unpaired against
    stored runs, or paired over interleaved pairs."""
    est = (decision.paired if paired else decision.unpaired)(_positive(c.runs), _positive(b.runs), design)
    v.delta, v.level, v.threshold, v.next_look = est.ratio - 1, est.level, t, est.next_look
    v.low = None if est.lo is None else est.lo - 1
    v.high = None if est.hi is None else est.hi - 1
    worse = _worse(est, c.direction)
    runs = (f"{len(c.runs)} interleaved pairs" if paired else f"{len(c.runs)} current against {len(b.runs)} stored run(s)")
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


def decide_job(test: str, label: str, entry: JobEntry | None, config_hash: str, current: dict[str, MetricSeries],
               policy: Policy, missing_reason: str, design: Design = Design()) -> list[MetricVerdict]:
    out = []
    for name, series in current.items():
        if not policy.gates(name):
            continue
        if entry is None:
            v = decide_metric(test, label, name, None, series, policy, design)
            v.note = missing_reason
        elif entry.config_hash != config_hash:
            v = decide_metric(test, label, name, None, series, policy, design)
            v.status = "not comparable"
            v.note = f"the job's configuration changed (hash {entry.config_hash} -> {config_hash})"
        else:
            v = decide_metric(test, label, name, entry.metrics.get(name), series, policy, design)
        out.append(v)
    return out


def note_deciding_figure(verdicts: list[MetricVerdict], figures: JobFigures) -> None:
    """Where step time stays inconclusive and a work figure decided, both verdicts say which decided and why
    wall time could not (the host-bound share, or wall time's own run-to-run spread)."""
    wall = next((v for v in verdicts if v.metric == "step_time"), None)
    if wall is None or wall.status != "inconclusive":
        return
    decided = [v for v in verdicts if v.metric in WORK_METRICS and v.status in ("pass", "fail", "improved")]
    if not decided:
        return
    spread = f"wall time run-to-run {wall.current_cv:.1%}" if wall.current_cv is not None else "too few runs"
    why = figures.host_bound_text() or spread
    names = ", ".join(f"{v.metric} {v.status.upper()}" for v in decided)
    wall.note = (wall.note + "; " if wall.note else "") + f"the work figures decided ({names}): {why}"
    for v in decided:
        v.note = (v.note + "; " if v.note else "") + f"decided where step time stayed inconclusive ({why})"


def is_pending(v: MetricVerdict) -> bool:
    """A verdict more runs of the candidate could decide."""
    return v.status == "inconclusive" and v.metric_kind in ("time", "memory")


def is_failing(v: MetricVerdict, policy: Policy) -> bool:
    return (v.status == "fail" or (v.status == "improved" and policy.fail_on_improvement)
            or (v.status in ("new", "not comparable") and policy.require_baseline)
            or (v.status == "inconclusive" and policy.strict))


def until_job_decided(verdicts: Callable[[], list[MetricVerdict]], runs: Callable[[], int],
                      extend: Callable[[], None] | None, budget: Budget, clock: Clock, save_mode: bool = False,
                      progress: Callable[[str], None] | None = None, label: str = "",
                      against: str = "baseline", unit: str = "runs") -> str:
    """The gate's stopping rule for one job, under decision.look_until: while a time or memory verdict is
    INCONCLUSIVE (with --distperf-save: until the budget's runs are recorded), `extend` adds a run (or a pair) and
    the job is decided again, up to the budget. Returns why it stopped. `against` and `unit` word the progress
    line: "baseline" and "runs" for the stored gate, "head vs base" and "pairs" for decide/against.py."""

    def pending(current: list[MetricVerdict]) -> bool:
        # A failed figure fails the test whatever more runs would show: no more runs for the undecided ones.
        return ((runs() < budget.max_pairs) if save_mode else
                any(is_pending(v) for v in current) and not any(v.status == "fail" for v in current))

    def say(current: list[MetricVerdict], target: int) -> None:
        assert progress is not None
        n = runs()
        if save_mode:
            progress(f"baseline: recording {label}, runs {n + 1}-{target} of {budget.max_pairs}")
            return
        v = next(v for v in current if is_pending(v))
        progress(f"{against} {v.metric} of {label} inconclusive after {n} {unit} ({fmt_pct(v.delta)} "
                 f"{fmt_interval(asdict(v))} vs +{(v.threshold or 0):.1%}), running {unit} {n + 1}-{target} "
                 f"for the look at {target}")

    _, why = decision.look_until(verdicts, pending, lambda _: runs(), extend, budget, clock,
                                 say if progress else None)
    return f"{runs()} runs recorded" if save_mode and why == "decided" else why


# -- the per-test gate ---------------------------------------------------------------------
class GateSession:
    """Per-process state shared by the tests' gates: the store and the fingerprints."""

    def __init__(self, settings: GateSettings, rootdir: str):
        self.settings, self.rootdir = settings, rootdir
        self.store = Store(settings.baselines_dir, settings.project_root)
        self._machines: dict[tuple[str, int, int, str], fingerprint.MachineClass] = {}
        self._environments: dict[str, dict[str, Any]] = {}

    def machine(self, device: str, world_size: int, nodes: int = 1, inter_node: str = "none"
                ) -> fingerprint.MachineClass:
        key = (device, world_size, nodes, inter_node)
        if key not in self._machines:
            self._machines[key] = fingerprint.machine_class(device, world_size, nodes, inter_node)
        return self._machines[key]

    def environment(self, device: str) -> dict[str, Any]:
        if device not in self._environments:
            self._environments[device] = fingerprint.soft_metadata(device, self.rootdir)
        return self._environments[device]

    def accept_command(self, nodeid: str) -> str:
        return " ".join(["pytest", "--distperf", "--distperf-save", *map(shlex.quote, self.settings.accept_args),
                         shlex.quote(nodeid)])


@dataclass
class Landing:
    """What the test's report gets: failure or not, the message, JUnit properties, details for reports and
    the final verdict records (decided on all the runs the test's jobs had when it ended)."""

    failed: bool
    message: str | None
    properties: list[tuple[str, str]] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)
    records: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class Measured:
    """One job of the test as the baseline keys it, and every run list it was measured in (lists may grow:
    runs shared with other tests, extended while a verdict is undecided)."""

    key: str  # the label, plus the injection knobs when the job carries any (never shares a series)
    label: str  # the label an injected job falls back to in the baseline
    config_hash: str
    config: dict[str, Any]
    sources: list[list[RunResult]] = field(default_factory=list)

    @property
    def runs(self) -> list[RunResult]:
        seen: set[int] = set()
        out = []
        for source in self.sources:
            for r in source:
                if id(r) not in seen:
                    seen.add(id(r))
                    out.append(r)
        return out


class BaselineGate:
    """One test's baseline: read at fixture setup (a bad file fails the test before any job starts), told
    about each job's runs as they finish (and extending them while a verdict is undecided, up to `budget`),
    decided on all the runs when the test ends, saved then with --distperf-save when the test passed."""

    def __init__(self, session: GateSession, nodeid: str, device: str, world_size: int, policy: Policy,
                 nodes: int = 1, inter_node: str = "none", test_file: str | None = None):
        self.session, self.nodeid, self.policy = session, nodeid, policy
        self.machine = session.machine(device, world_size, nodes, inter_node)
        self.environment = session.environment(device)
        # The file's key does not move with the rootdir (store.Store): the test file from the project root.
        self.key = session.store.key_for(test_file, nodeid) if test_file else nodeid
        self.path = session.store.path_for(self.machine.name, self.key)
        # --distperf-save over an unusable file (corrupt, wrongly typed, too large): moved aside when the new one is
        # written (_save), as the error of a run without --distperf-save promises; any other BaselineError stands.
        self.unusable: str | None = None
        try:
            self.baseline: BaselineFile | None = session.store.load(self.path, self.key)  # BaselineError
        except BaselineReplaceable as e:
            if not session.settings.save:
                raise
            self.baseline, self.unusable = None, str(e)
        # No file, but the folder holds others: said when a job is decided (a test with no gated job stays quiet).
        self.unmatched = None if self.baseline else session.store.unmatched_note(self.machine.name, self.key)
        self.unmatched_said = False
        self.env_changes = (fingerprint.soft_differences(self.baseline.environment, self.environment)
                            if self.baseline else [])
        if self.env_changes:
            warnings.warn(BaselineEnvironmentWarning(
                f"{os.path.relpath(self.path, session.rootdir)}: recorded with other versions than this run: "
                f"{', '.join(self.env_changes)}"), stacklevel=2)
        self.measured: dict[str, Measured] = {}
        self.verdicts: list[MetricVerdict] = []
        self.stopped: dict[str, str] = {}  # job key -> why it got no more runs
        self.budget = Budget()  # adaptive repeats: the test's (the fixture sets it)

    @property
    def save_mode(self) -> bool:
        return self.session.settings.save

    @property
    def design(self) -> Design:
        return self.budget.design()  # its planned looks are those until_job_decided steps to

    def _key(self, job: JobSpec) -> Measured:
        """The job's entry: the same label with another configuration gets '#2', '#3' ... (stable by order); a
        job with injected work is keyed apart from the clean one (' +extra_work=0.4')."""
        label, config_hash, config, injection = job_identity(job)
        n, base = 1, label
        while base in self.measured and self.measured[base].config_hash != config_hash:
            n += 1
            base = f"{label} #{n}"
        key = base + injection
        if key not in self.measured:
            self.measured[key] = Measured(key=key, label=base, config_hash=config_hash, config=config)
        return self.measured[key]

    def _entry(self, m: Measured) -> JobEntry | None:
        """The job's stored entry; a job with injected work falls back to its clean job's (a slowdown reads as a
        regression of the same job, as a code change would)."""
        if self.baseline is None:
            return None
        return self.baseline.jobs.get(m.key) or self.baseline.jobs.get(m.label)

    def _decide(self, m: Measured) -> list[MetricVerdict]:
        reason = (f"no baseline for this test on machine class {self.machine.name}" if self.baseline is None
                  else "this job is not in the baseline")
        if self.unmatched:
            reason = self.unmatched
            if not self.unmatched_said:  # once per test; every verdict keeps the note
                self.unmatched_said = True
                warnings.warn(BaselineUnmatchedWarning(f"{self.nodeid}: {self.unmatched}"), stacklevel=2)
        out = decide_job(self.nodeid, m.key, self._entry(m), m.config_hash, metrics_from_runs(m.runs), self.policy,
                         reason, self.design)
        for v in out:
            v.stopped = self.stopped.get(m.key, "")
        if m.runs:
            note_deciding_figure(out, job_figures(m.key, m.runs))
        return out

    def check(self, job: JobSpec, runs: list[RunResult], extend: Callable[[], None] | None = None,
              clock: Clock | None = None, progress: Callable[[str], None] | None = None) -> list[MetricVerdict]:
        """A job's runs finished (`runs` may be a shared list that grows). While a time or memory verdict is
        INCONCLUSIVE, `extend` adds a run (or an interleaved pair) to it, up to the budget; with
        --distperf-save it adds runs up to the budget's count instead (the stored runs bound later verdicts).
        Returns the verdicts as they stand; the test's are decided again on all runs in finish()."""
        m = self._key(job)
        if not any(source is runs for source in m.sources):
            m.sources.append(runs)
        self.stopped[m.key] = until_job_decided(lambda: self._decide(m), lambda: len(m.runs), extend, self.budget,
                                            clock or Clock(), self.save_mode, progress, m.key)
        return self._decide(m)

    def finish(self, test_passed: bool) -> Landing:
        """Decide every job on all its runs; save (with --distperf-save, when the test passed) or decide
        whether the verdicts fail the test. An INCONCLUSIVE verdict warns (fails with --distperf-strict)."""
        self.verdicts = [v for m in self.measured.values() if m.runs for v in self._decide(m)]
        detail = self._detail()
        props = [(f"distperf.baseline.{v.metric}[{v.job}]", property_text(v)) for v in self.verdicts]
        records = [v.to_record(self.policy, enforced=not self.save_mode) for v in self.verdicts]
        if self.save_mode:
            if not test_passed or not self.measured:
                detail["saved"] = None
                return Landing(False, None, props, detail, records)
            jobs = {m.key: JobEntry(label=m.key, config_hash=m.config_hash, config=m.config,
                                    metrics=metrics_from_runs(m.runs)) for m in self.measured.values()}
            try:
                detail["saved"] = self._save(jobs)
            except BaselineError as e:
                return Landing(True, f"distperf --distperf-save: {e}", props, detail, records)
            props.append(("distperf.baseline.saved", detail["saved"]))
            return Landing(False, None, props, detail, records + self._resolutions(detail["saved"], jobs))
        for v in self.verdicts:
            if v.status == "inconclusive" and not self.policy.strict:
                warnings.warn(DistPerfInconclusive(f"{self.nodeid}: baseline {describe_verdict(v, self.policy)[0]}; "
                                                   f"{v.note}"), stacklevel=2)
        failing = [v for v in self.verdicts if is_failing(v, self.policy)]
        return Landing(bool(failing), self._message(failing) if failing else None, props, detail, records)

    def _resolutions(self, path: str, jobs: dict[str, JobEntry]) -> list[dict[str, Any]]:
        """What the saved file lets later runs decide, per job and metric; a warning for each that cannot pass."""
        rel = os.path.relpath(path, self.session.rootdir)
        found = [r for key, entry in jobs.items() for r in resolutions(key, entry.metrics, self.policy, self.design)]
        for r in found:
            if not r.can_pass:
                warnings.warn(BaselineNoisyWarning(
                    f"{self.nodeid}: saved {rel}, but {r.text()}: record it on a quieter machine, or with more "
                    f"runs (--distperf-max-repeats)"), stacklevel=2)
        return [r.to_record(self.nodeid, rel) for r in found]

    def _save(self, jobs: dict[str, JobEntry]) -> str:
        doc = BaselineFile(test=self.key, machine_class=self.machine.name, machine=self.machine.to_dict(),
                           environment=self.environment, saved_at=now_iso(), jobs=jobs)
        if self.unusable:
            aside = self.session.store.move_aside(self.path, self.key)
            if aside:
                warnings.warn(BaselineReplacedWarning(
                    f"{self.nodeid}: the baseline {os.path.relpath(self.path, self.session.rootdir)} could not be "
                    f"used ({self.unusable}); moved it aside to {os.path.basename(aside)} (nothing deleted) and "
                    f"saved a new one"), stacklevel=2)
        return self.session.store.save(doc)

    def _detail(self) -> dict[str, Any]:
        return {
            "machine_class": self.machine.name, "machine": self.machine.to_dict(), "environment": self.environment,
            "baseline_file": self.path, "baseline_saved_at": self.baseline.saved_at if self.baseline else None,
            "baseline_environment": self.baseline.environment if self.baseline else None,
            "environment_changes": self.env_changes,
            "jobs": [job_to_dict(m.key, m.config_hash, m.config, m.runs) for m in self.measured.values() if m.runs],
        }

    def _message(self, failing: list[MetricVerdict]) -> str:
        rel = os.path.relpath(self.path, self.session.rootdir)
        lines = [f"distperf baseline gate failed for {self.nodeid} (machine class {self.machine.name}):"]
        for v in failing:
            lines += ["  " + line for line in describe_verdict(v, self.policy)]
        if self.baseline is not None:
            env = self.baseline.environment
            lines.append(f"  baseline: {rel}, saved {self.baseline.saved_at or '?'} at commit "
                         f"{(env.get('git_commit') or '?')[:12]} on host {env.get('host') or '?'}")
            if self.env_changes:
                lines.append(f"  versions changed since the baseline: {', '.join(self.env_changes)}")
        else:
            lines.append(f"  baseline file (missing): {rel}")
        lines += ["  to accept the current numbers as the new baseline, run:",
                  f"    {self.session.accept_command(self.nodeid)}"]
        return "\n".join(lines)


def _with_spread(value: float | None, cv: float | None, runs: int, unit: str, kind: str) -> str:
    text = fmt_value(value, unit)
    if kind == "count":
        return f"{text} ({'worst of ' if runs > 1 else ''}{runs} run{'s' if runs != 1 else ''})"
    spread = f", run-to-run {cv:.1%}" if cv is not None else ""
    return f"{text} (geometric mean of {runs} run{'s' if runs != 1 else ''}{spread})"


def describe_verdict(v: MetricVerdict, policy: Policy, sides: tuple[str, str] = ("baseline", "current")) -> list[str]:
    """The lines of a failure message for one verdict; `sides` names its reference and candidate."""
    head = f"{v.job}: {v.metric} {v.status.upper()}"
    current = _with_spread(v.current, v.current_cv, v.current_runs, v.unit, v.metric_kind)
    if v.status in ("new", "not comparable"):
        why = " (--distperf-require-baseline)" if policy.require_baseline else ""
        return [f"{head}: {v.note}{why}; current {current}"]
    record = asdict(v)
    text = fmt_interval(record)
    interval = ("" if v.level is None else f": {text}" if is_words(text) else f", {v.level:.0%} interval {text}")
    width = max(map(len, sides))
    lines = [f"{head}: {fmt_pct(v.delta)} vs {sides[0]}{interval}; limit {v.threshold_text}",
             f"  {sides[0]:<{width}} {_with_spread(v.baseline, v.baseline_cv, v.baseline_runs, v.unit, v.metric_kind)}",
             f"  {sides[1]:<{width}} {current}"]
    if v.note:
        lines.append(f"  {v.note}" + (f"; {v.stopped}" if v.stopped and v.stopped != "decided" else ""))
    if v.status == "inconclusive" and policy.strict:
        lines.append("  (an inconclusive verdict fails because of --distperf-strict)")
    if v.status == "improved":
        lines.append("  (an improvement fails only because --distperf-fail-on-improvement was given)")
    return lines


def property_text(v: MetricVerdict) -> str:
    return f"{v.status} {fmt_pct(v.delta)} baseline={fmt_value(v.baseline, v.unit)} current={fmt_value(v.current, v.unit)}"
