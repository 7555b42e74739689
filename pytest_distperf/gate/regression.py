"""The regression verdict against a stored baseline, per metric, and the per-test gate that applies it.

Decision rules (per metric; "worse" follows the metric's direction):
- time: a regression only when candidate/baseline - 1 exceeds T = max(5 %, k x the baseline's
  run-to-run variation) AND the difference is significant over run-level repeats (a pooled
  t-interval on the log of the per-run medians; never over the steps of one run, which drift
  together). Between T/2 and T, or above T without significance: a warning.
- memory: fails when it grows by more than max(2 %, 64 MiB).
- counts: exact.
- an improvement beyond the threshold reads "improved -- refresh the baseline" and fails only with
  --distperf-fail-on-improvement.
- no baseline (file, job or metric): "new" -- a failure only with --distperf-require-baseline; a job
  whose configuration hash changed: "not comparable", never "regression".
A breach is confirmed by one automatic re-run of the job before the test fails.

The decision functions are pure; BaselineGate (one per test) holds the baseline file, calls them when a
job's runs finish, re-runs on a breach and lands the outcome (or the saved file) at the end.
"""

from __future__ import annotations

import math
import os
import shlex
import statistics
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from pytest_distperf.errors import BaselineEnvironmentWarning, BaselineUnmatchedWarning
from pytest_distperf.gate import fingerprint
from pytest_distperf.gate.store import (KNOWN_METRICS, BaselineError, BaselineFile, JobEntry, MetricSeries, Store,
                                      job_identity, metrics_from_runs, now_iso, run_to_dict)
from pytest_distperf.config import SettingsError
from pytest_distperf.spec import JobSpec
from pytest_distperf.results import RunResult
from pytest_distperf.measure.stats import t95
from pytest_distperf.measure.units import fmt_bytes, fmt_seconds


@dataclass(frozen=True)
class Policy:
    time_threshold: float = 0.05  # the 5 % floor of T
    time_k: float = 3.0  # T = max(time_threshold, time_k x baseline run-to-run variation)
    memory_threshold: float = 0.02
    memory_floor: int = 64 << 20  # bytes
    fail_on_improvement: bool = False
    require_baseline: bool = False
    metrics: tuple[str, ...] | None = None  # gated metrics; None: all

    def gates(self, metric: str) -> bool:
        return self.metrics is None or metric in self.metrics


def policy_for(base: Policy, marker_kwargs: dict[str, Any], where: str) -> Policy:
    """`base` with the test's @pytest.mark.distperf(...) overrides; SettingsError naming the marker key."""

    def number(key: str, low: float, high: float) -> float:
        value = marker_kwargs[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            raise SettingsError(f"{where}: distperf({key}={value!r}): expected a number in [{low:g}, {high:g}]")
        return float(value)

    changes: dict[str, Any] = {}
    if "time_threshold" in marker_kwargs:
        changes["time_threshold"] = number("time_threshold", 0.0, 10.0)
    if "time_k" in marker_kwargs:
        changes["time_k"] = number("time_k", 0.0, 100.0)
    if "memory_threshold" in marker_kwargs:
        changes["memory_threshold"] = number("memory_threshold", 0.0, 10.0)
    if "memory_floor" in marker_kwargs:
        changes["memory_floor"] = int(number("memory_floor", 0, float(1 << 50)))
    if "baseline_metrics" in marker_kwargs:
        names = marker_kwargs["baseline_metrics"]
        if isinstance(names, str) or not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise SettingsError(f"{where}: distperf(baseline_metrics={names!r}): expected a list of metric names "
                                f"(() gates none)")
        unknown = [n for n in names if n not in KNOWN_METRICS and not n.startswith("comms.")]
        if unknown:
            raise SettingsError(f"{where}: distperf(baseline_metrics=...): unknown metric(s) {unknown}; known: "
                                f"{', '.join(KNOWN_METRICS)} and comms.<kind>.calls_per_step / .bytes_per_step")
        changes["metrics"] = tuple(names)
    return replace(base, **changes)


@dataclass
class Verdict:
    test: str
    job: str
    metric: str
    metric_kind: str  # time | memory | count
    unit: str
    direction: str
    status: str  # pass | warn | fail | improved | new | not comparable
    baseline: float | None = None  # central value (median of the baseline's runs)
    current: float | None = None
    baseline_spread: float | None = None  # standard deviation of the run values
    current_spread: float | None = None
    baseline_runs: int = 0
    current_runs: int = 0
    delta: float | None = None  # candidate/baseline - 1 (time: ratio of geometric means of run medians)
    low: float | None = None  # 95 % interval of delta (time)
    high: float | None = None
    threshold: float | None = None  # relative threshold applied
    threshold_text: str = ""
    significant: bool | None = None
    rerun: bool = False  # a confirmation re-run was made
    confirmed: bool = False  # ... and it breached again
    note: str = ""

    def to_record(self, policy: Policy, enforced: bool = True) -> dict[str, Any]:
        """A plain record for reports; `fails`: whether this verdict fails the test (never while saving)."""
        return {"kind": "baseline", **asdict(self), "fails": enforced and is_failing(self, policy)}


# -- the pure decision ------------------------------------------------------------------------------------------
def decide_metric(test: str, job: str, metric: str, baseline: MetricSeries | None, current: MetricSeries,
                  policy: Policy) -> Verdict:
    v = Verdict(test=test, job=job, metric=metric, metric_kind=current.kind, unit=current.unit,
                direction=current.direction, status="new", current=current.center, current_spread=current.spread,
                current_runs=len(current.runs))
    if baseline is None:
        v.note = "no baseline value for this metric"
        return v
    v.baseline, v.baseline_spread, v.baseline_runs = baseline.center, baseline.spread, len(baseline.runs)
    if baseline.center:
        v.delta = current.center / baseline.center - 1
    sign = 1.0 if current.direction == "lower" else -1.0
    if current.kind == "time":
        _decide_time(v, baseline, current, policy, sign)
    elif current.kind == "memory":
        _decide_memory(v, baseline, current, policy, sign)
    else:
        _decide_count(v, baseline, current, sign)
    return v


def _decide_time(v: Verdict, b: MetricSeries, c: MetricSeries, policy: Policy, sign: float) -> None:
    if any(x <= 0 for x in (*b.runs, *c.runs)):
        v.status, v.note = "warn", "non-positive times cannot be compared"
        return
    lb, lc = [math.log(x) for x in b.runs], [math.log(x) for x in c.runs]
    diff = statistics.fmean(lc) - statistics.fmean(lb)
    v.delta = math.exp(diff) - 1
    variation = b.variation or 0.0
    t = max(policy.time_threshold, policy.time_k * variation)
    v.threshold = t
    v.threshold_text = (f"max({policy.time_threshold:.0%}, {policy.time_k:g} x {variation:.1%} run-to-run) = {t:.1%}"
                        if b.variation is not None else f"{t:.1%} (baseline has one run: no run-to-run variation)")
    df = len(lb) + len(lc) - 2
    half = None
    if df >= 1:
        ss = sum((x - statistics.fmean(lb)) ** 2 for x in lb) + sum((x - statistics.fmean(lc)) ** 2 for x in lc)
        half = t95(df) * math.sqrt(ss / df) * math.sqrt(1 / len(lb) + 1 / len(lc))
        v.low, v.high = math.exp(diff - half) - 1, math.exp(diff + half) - 1
    worse = sign * diff  # > 0: worse, in log units
    r = math.exp(worse) - 1  # relative change in the "worse" direction
    sig_worse = half is not None and worse - half > 0
    sig_better = half is not None and worse + half < 0
    v.significant = (sig_worse or sig_better) if half is not None else None
    runs = f"{len(lb)} baseline vs {len(lc)} current run(s)"
    if r > t and sig_worse:
        v.status, v.note = "fail", f"slower by more than T and significant over {runs}"
    elif r < -t and sig_better:
        v.status, v.note = "improved", f"faster by more than T ({runs}): refresh the baseline"
    elif r > t:
        v.status = "warn"
        v.note = (f"above T but not significant over {runs}" if half is not None
                  else "above T, but one run per side cannot show significance: use repeats")
    elif r > t / 2:
        v.status, v.note = "warn", "between T/2 and T"
    else:
        v.status = "pass"


def _decide_memory(v: Verdict, b: MetricSeries, c: MetricSeries, policy: Policy, sign: float) -> None:
    limit = max(policy.memory_threshold * abs(b.center), float(policy.memory_floor))
    worse = sign * (c.center - b.center)
    v.threshold = limit / b.center if b.center else None
    v.threshold_text = f"max({policy.memory_threshold:.0%}, {fmt_bytes(policy.memory_floor)}) = {fmt_bytes(limit)}"
    if worse > limit:
        v.status, v.note = "fail", f"grew by {fmt_bytes(worse)}, more than {fmt_bytes(limit)}"
    elif worse < -limit:
        v.status, v.note = "improved", f"shrank by {fmt_bytes(-worse)}: refresh the baseline"
    elif worse > limit / 2:
        v.status, v.note = "warn", "grew by more than half the limit"
    else:
        v.status = "pass"


def _decide_count(v: Verdict, b: MetricSeries, c: MetricSeries, sign: float) -> None:
    v.threshold, v.threshold_text = 0.0, "exact"
    worse = sign * (c.center - b.center)
    if worse > 0:
        v.status, v.note = "fail", "differs from the baseline (counts must match exactly)"
    elif worse < 0:
        v.status, v.note = "improved", "lower than the baseline: refresh the baseline"
    else:
        v.status = "pass"
    if len(set(c.runs)) > 1:
        v.note = (v.note + "; " if v.note else "") + "the count varies between runs"


def decide_job(test: str, label: str, entry: JobEntry | None, config_hash: str, current: dict[str, MetricSeries],
               policy: Policy, missing_reason: str) -> list[Verdict]:
    out = []
    for name, series in current.items():
        if not policy.gates(name):
            continue
        if entry is None:
            v = decide_metric(test, label, name, None, series, policy)
            v.note = missing_reason
        elif entry.config_hash != config_hash:
            v = decide_metric(test, label, name, None, series, policy)
            v.status = "not comparable"
            v.note = f"the job's configuration changed (hash {entry.config_hash} -> {config_hash})"
        else:
            v = decide_metric(test, label, name, entry.metrics.get(name), series, policy)
        out.append(v)
    return out


def is_breach(v: Verdict, policy: Policy) -> bool:
    """A verdict that would fail the test and is confirmed by a re-run first."""
    return v.status == "fail" or (v.status == "improved" and policy.fail_on_improvement)


def is_failing(v: Verdict, policy: Policy) -> bool:
    return is_breach(v, policy) or (v.status in ("new", "not comparable") and policy.require_baseline)


def confirm(first: list[Verdict], second: list[Verdict], policy: Policy) -> list[Verdict]:
    """Combine a job's verdicts with those of its confirmation re-run: a breach stands only if the re-run
    breaches the same way; otherwise it is downgraded to a warning."""
    again = {v.metric: v for v in second}
    out = []
    for v in first:
        w = again.get(v.metric)
        if not is_breach(v, policy) or w is None:
            out.append(v)
            continue
        first_delta = _pct(v.delta)
        if is_breach(w, policy) and w.status == v.status:
            out.append(replace(w, rerun=True, confirmed=True,
                               note=f"{w.note}; confirmed by a re-run (first run set: {first_delta})"))
        else:
            out.append(replace(w, status="warn", rerun=True, confirmed=False,
                               note=f"{v.status} at {first_delta} not confirmed by a re-run ({_pct(w.delta)})"))
    return out


# -- session settings and the per-test gate ---------------------------------------------------------------------
@dataclass(frozen=True)
class GateSettings:
    baselines_dir: str
    save: bool
    policy: Policy
    accept_args: tuple[str, ...] = ()  # options repeated in the "accept this change" command


def gate_settings(rootdir: str, baselines_cli: str | None, baselines_ini: str | None, save: bool,
                  require_baseline: bool, fail_on_improvement: bool, carried: dict[str, Any]) -> GateSettings:
    """`carried`: the command-line options that pick the machine class or the jobs (repeated in the accept
    command). SettingsError naming the option when the baselines folder is unusable."""
    if baselines_cli not in (None, ""):
        raw, where, base = baselines_cli, "--distperf-baselines", os.getcwd()
    elif baselines_ini not in (None, ""):
        raw, where, base = baselines_ini, "ini option distperf_baselines", rootdir
    else:
        raw, where, base = "baselines", "default baselines folder", rootdir
    path = os.path.normpath(os.path.join(base, os.path.expanduser(str(raw))))
    if os.path.exists(path) and not os.path.isdir(path):
        raise SettingsError(f"{where}: {path} exists and is not a folder")
    args: list[str] = []
    if baselines_cli not in (None, ""):
        args += ["--distperf-baselines", str(baselines_cli)]
    for flag, value in carried.items():
        if value not in (None, ""):
            args += [flag, str(value)]
    return GateSettings(baselines_dir=path, save=save,
                        policy=Policy(fail_on_improvement=fail_on_improvement, require_baseline=require_baseline),
                        accept_args=tuple(args))


class GateSession:
    """Per-process state shared by the tests' gates: the store, fingerprints, confirmation re-runs."""

    def __init__(self, settings: GateSettings, rootdir: str):
        self.settings, self.rootdir = settings, rootdir
        self.store = Store(settings.baselines_dir)
        self._machines: dict[tuple[str, int, int, str], fingerprint.MachineClass] = {}
        self._environments: dict[str, dict[str, Any]] = {}
        # A job is re-run to confirm a breach once per session, whichever tests share its runs:
        # config hash -> [(the runs that breached, their confirmation runs)].
        self._confirmations: dict[str, list[tuple[list[RunResult], list[RunResult]]]] = {}

    def confirmation(self, config_hash: str, runs: list[RunResult],
                     rerun: Callable[[], list[RunResult]]) -> list[RunResult]:
        for original, again in self._confirmations.get(config_hash, []):
            if len(original) == len(runs) and all(a is b for a, b in zip(original, runs)):
                return again
        again = rerun()
        self._confirmations.setdefault(config_hash, []).append((runs, again))
        return again

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
    """What the test's report gets: failure or not, the message, JUnit properties, details for reports."""

    failed: bool
    message: str | None
    properties: list[tuple[str, str]] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)


class BaselineGate:
    """One test's baseline: read at fixture setup (a bad file fails the test before any job starts),
    checked whenever a job's runs finish, saved at the end with --distperf-save when the test passed."""

    def __init__(self, session: GateSession, nodeid: str, device: str, world_size: int, policy: Policy,
                 nodes: int = 1, inter_node: str = "none", test_file: str | None = None):
        self.session, self.nodeid, self.policy = session, nodeid, policy
        self.machine = session.machine(device, world_size, nodes, inter_node)
        self.environment = session.environment(device)
        # The file's key does not move with the rootdir (store.Store): the test file from the project root.
        self.key = session.store.key_for(test_file, nodeid) if test_file else nodeid
        self.path = session.store.path_for(self.machine.name, self.key)
        self.baseline: BaselineFile | None = session.store.load(self.path, self.key)  # BaselineError
        # No file, but the folder holds others: said when a job is decided (a test with no gated job stays quiet).
        self.unmatched = None if self.baseline else session.store.unmatched_note(self.machine.name, self.key)
        self.unmatched_said = False
        self.env_changes = (fingerprint.soft_differences(self.baseline.environment, self.environment)
                            if self.baseline else [])
        if self.env_changes:
            warnings.warn(BaselineEnvironmentWarning(
                f"{os.path.relpath(self.path, session.rootdir)}: recorded with other versions than this run: "
                f"{', '.join(self.env_changes)}"), stacklevel=2)
        self.measured: dict[str, tuple[str, dict[str, Any], list[RunResult]]] = {}
        self.verdicts: list[Verdict] = []

    @property
    def save_mode(self) -> bool:
        return self.session.settings.save

    def _label(self, label: str, config_hash: str) -> str:
        """The same label twice in a test with another configuration gets '#2', '#3' ... (stable by order)."""
        n, key = 1, label
        while key in self.measured and self.measured[key][0] != config_hash:
            n += 1
            key = f"{label} #{n}"
        return key

    def check(self, job: JobSpec, runs: list[RunResult], rerun: Callable[[], list[RunResult]]) -> list[dict[str, Any]]:
        """Verdicts of one job's runs against the baseline (records for reports); on a breach the job is
        re-run once (`rerun`) and the breach must hold again."""
        label, config_hash, config = job_identity(job)
        label = self._label(label, config_hash)
        if label in self.measured:  # the same job again in this test: its runs add up
            seen = {id(r) for r in self.measured[label][2]}
            runs = self.measured[label][2] + [r for r in runs if id(r) not in seen]
        self.measured[label] = (config_hash, config, runs)
        entry = self.baseline.jobs.get(label) if self.baseline else None
        reason = (f"no baseline for this test on machine class {self.machine.name}" if self.baseline is None
                  else "this job is not in the baseline")
        if self.unmatched:
            reason = self.unmatched
            if not self.unmatched_said:  # once per test; every verdict keeps the note
                self.unmatched_said = True
                warnings.warn(BaselineUnmatchedWarning(f"{self.nodeid}: {self.unmatched}"), stacklevel=2)
        verdicts = decide_job(self.nodeid, label, entry, config_hash, metrics_from_runs(runs), self.policy, reason)
        if not self.save_mode and any(is_breach(v, self.policy) for v in verdicts):
            again = decide_job(self.nodeid, label, entry, config_hash,
                               metrics_from_runs(self.session.confirmation(config_hash, runs, rerun)), self.policy,
                               reason)
            verdicts = confirm(verdicts, again, self.policy)
        self.verdicts = [v for v in self.verdicts if v.job != label] + verdicts
        return [v.to_record(self.policy, enforced=not self.save_mode) for v in verdicts]

    def finish(self, test_passed: bool) -> Landing:
        """Save (with --distperf-save, when the test passed) or decide whether the verdicts fail the test."""
        detail = self._detail()
        props = [(f"distperf.baseline.{v.metric}[{v.job}]", _property_text(v)) for v in self.verdicts]
        if self.save_mode:
            if not test_passed or not self.measured:
                detail["saved"] = None
                return Landing(False, None, props, detail)
            try:
                detail["saved"] = self._save()
            except BaselineError as e:
                return Landing(True, f"distperf --distperf-save: {e}", props, detail)
            props.append(("distperf.baseline.saved", detail["saved"]))
            return Landing(False, None, props, detail)
        failing = [v for v in self.verdicts if is_failing(v, self.policy)]
        return Landing(bool(failing), self._message(failing) if failing else None, props, detail)

    def _save(self) -> str:
        jobs = {}
        for label, (config_hash, config, runs) in self.measured.items():
            jobs[label] = JobEntry(label=label, config_hash=config_hash, config=config,
                                   metrics=metrics_from_runs(runs))
        doc = BaselineFile(test=self.key, machine_class=self.machine.name, machine=self.machine.to_dict(),
                           environment=self.environment, saved_at=now_iso(), jobs=jobs)
        return self.session.store.save(doc)

    def _detail(self) -> dict[str, Any]:
        return {
            "machine_class": self.machine.name, "machine": self.machine.to_dict(), "environment": self.environment,
            "baseline_file": self.path, "baseline_saved_at": self.baseline.saved_at if self.baseline else None,
            "baseline_environment": self.baseline.environment if self.baseline else None,
            "environment_changes": self.env_changes,
            "jobs": [{"label": label, "config_hash": h, "config": config, "runs": [run_to_dict(r) for r in runs]}
                     for label, (h, config, runs) in self.measured.items()],
        }

    def _message(self, failing: list[Verdict]) -> str:
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


# -- wording ----------------------------------------------------------------------------------------------------
def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        return fmt_seconds(value)
    if unit == "bytes":
        return fmt_bytes(value)
    return f"{value:.6g}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


fmt_pct = _pct
STATUS_MARK = {"pass": "✓", "warn": "~", "fail": "✗", "improved": "✓ improved", "new": "new",
               "not comparable": "≠ config"}


def status_mark(record: dict[str, Any]) -> str:
    """✓ ~ ✗ new ... of a verdict record; a verdict that fails the test always shows ✗."""
    mark = STATUS_MARK.get(record["status"], record["status"])
    if record.get("fails") and not mark.startswith("✗"):
        mark = "✗ " + mark.replace("✓ ", "")
    return mark


def fmt_interval(record: dict[str, Any]) -> str:
    if record.get("low") is None:
        return "-"
    return f"[{record['low']:+.1%}, {record['high']:+.1%}]"


def _with_spread(value: float | None, spread: float | None, runs: int, unit: str) -> str:
    text = fmt_value(value, unit)
    if spread is not None:
        text += f" ± {fmt_value(spread, unit)}"
    return f"{text} (median of {runs} run{'s' if runs != 1 else ''})"


def describe_verdict(v: Verdict, policy: Policy) -> list[str]:
    """The lines of a failure message for one verdict."""
    head = f"{v.job}: {v.metric} {v.status.upper()}"
    if v.status in ("new", "not comparable"):
        why = " (--distperf-require-baseline)" if policy.require_baseline else ""
        return [f"{head}: {v.note}{why}; current {_with_spread(v.current, v.current_spread, v.current_runs, v.unit)}"]
    interval = f", 95% interval {_pct(v.low)} .. {_pct(v.high)}" if v.low is not None else ""
    lines = [f"{head}: {_pct(v.delta)} vs baseline{interval}; threshold {v.threshold_text}",
             f"  baseline {_with_spread(v.baseline, v.baseline_spread, v.baseline_runs, v.unit)}",
             f"  current  {_with_spread(v.current, v.current_spread, v.current_runs, v.unit)}"]
    if v.note:
        lines.append(f"  {v.note}")
    if v.status == "improved":
        lines.append("  (an improvement fails only because --distperf-fail-on-improvement was given)")
    return lines


def _property_text(v: Verdict) -> str:
    return f"{v.status} {_pct(v.delta)} baseline={fmt_value(v.baseline, v.unit)} current={fmt_value(v.current, v.unit)}"
