"""The per-test baseline gate: the per-metric regression verdict (decide/verdicts.py) applied to each job of a
test against its stored baseline. While a time or memory verdict is INCONCLUSIVE the gate runs the job again, up to
the test's budget; what stays INCONCLUSIVE warns, or fails with --distperf-strict. With --distperf-save it records
each job up to the budget's runs instead: the stored runs bound what later verdicts can resolve.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from pytest_distperf.errors import (BaselineEnvironmentWarning, BaselineNoisyWarning, BaselineReplacedWarning,
                                    BaselineUnmatchedWarning, DistPerfInconclusive, warn)
from pytest_distperf.launch import fingerprint
from pytest_distperf.store.baselines import (BaselineError, BaselineFile, BaselineReplaceable, JobEntry, MetricSeries,
                                             Saved, Store, explain_tables, job_identity, metrics_from_runs, now_iso)
from pytest_distperf.decide import stopping
from pytest_distperf.decide.decision import Design
from pytest_distperf.decide.stopping import Budget, Clock
from pytest_distperf.decide.verdicts import (DetectableChange, MetricVerdict, decide_metric, describe_verdict,
                                             detectable_changes, failure_lines, is_failing, is_pending, job_metrics,
                                             property_text, secondary_text, set_job_runs)
from pytest_distperf.figures.explain import explain, explain_by
from pytest_distperf.figures.quantities import WORK_METRICS, JobFigures, JobRuns
from pytest_distperf.spec.job import JobSpec
from pytest_distperf.rank.results import RunResult
from pytest_distperf.decide.policy import GateSettings, Policy
from pytest_distperf.figures.units import fmt_pct


def decide_job(test: str, label: str, entry: JobEntry | None, config_hash: str, current: dict[str, MetricSeries],
               policy: Policy, missing_reason: str, design: Design = Design(), device: str | None = None,
               config: dict[str, Any] | None = None, script_sha256: str | None = None) -> list[MetricVerdict]:
    """The verdicts of one job's metrics against its stored entry; with the job's `device`, memory on the device's
    memory figure, the secondary one riding on its verdict. `config` (the job's now) names what changed in a
    changed configuration; `script_sha256` (a script job's file now) says when the script changed."""
    stored = entry.metrics if entry is not None and entry.config_hash == config_hash else {}
    script = script_change(entry, script_sha256)
    out = []
    for name in job_metrics(current, policy, device):
        v = decide_metric(test, label, name, stored.get(name), current[name], policy, design)
        if entry is None:
            v.note = missing_reason
        elif entry.config_hash != config_hash:
            v.status = "not comparable"
            v.note = config_change(entry, config_hash, config)
        if script and v.status in ("fail", "not comparable"):  # the first place to look for why
            v.note = (v.note + "; " if v.note else "") + script
        v.secondary = secondary_text(name, device, stored, current)
        out.append(v)
    out += [_not_measured(test, label, name, stored[name]) for name in job_metrics(stored, policy, device)
            if name not in current]
    set_job_runs(out, stored, current)
    return out


def _not_measured(test: str, label: str, metric: str, stored: MetricSeries) -> MetricVerdict:
    """A gated figure the baseline holds and this run did not measure: said, never dropped (it fails under
    --distperf-require-baseline, as a figure with no baseline does)."""
    return MetricVerdict(test=test, job=label, metric=metric, metric_kind=stored.kind, unit=stored.unit,
                         direction=stored.direction, status="not comparable", baseline=stored.center,
                         baseline_cv=stored.variation, baseline_runs=len(stored.runs),
                         note="in the baseline, not measured now (the JSON report's work_not_measured says why)")


MAX_CHANGES_SHOWN = 4


def config_change(entry: JobEntry, config_hash: str, config: dict[str, Any] | None) -> str:
    """'the job's configuration changed since the baseline: steps 8 -> 16 (hash ... -> ...)': the fields that
    differ, old -> new; the hashes alone where the stored entry holds no config to compare."""
    changes = entry.config_changes(config) if config is not None else []
    shown = "; ".join(changes[:MAX_CHANGES_SHOWN]) + (
        f"; and {len(changes) - MAX_CHANGES_SHOWN} more" if len(changes) > MAX_CHANGES_SHOWN else "")
    return (f"the job's configuration changed since the baseline{': ' + shown if shown else ''} "
            f"(hash {entry.config_hash} -> {config_hash})")


NEAREST = "the nearest there"  # how nearest_job's note begins: the terminal's "no baseline yet" section shows it


def nearest_job(stored: dict[str, JobEntry], config: dict[str, Any] | None) -> str:
    """'; the nearest there, <label>, differs in: script.args [...] -> [...]': the stored job whose configuration
    differs from this one's in the fewest fields, so a job renamed by a changed argument or option reads as that
    change, not only as new. '' when none is within MAX_CHANGES_SHOWN fields."""
    if not config:
        return ""
    found = [(len(changes), label, changes) for label, entry in stored.items()
             if entry.config and 0 < len(changes := entry.config_changes(config)) <= MAX_CHANGES_SHOWN]
    if not found:
        return ""
    _, label, changes = min(found)
    return f"; {NEAREST}, {label}, differs in: {'; '.join(changes)}"


def script_change(entry: JobEntry | None, script_sha256: str | None) -> str:
    """'the script's content changed since the baseline (sha256 ...)' when the stored and current hashes of a
    script job's file differ; '' otherwise (also for a baseline saved before the hash was kept)."""
    old = entry.script_sha256 if entry is not None else None
    if not old or not script_sha256 or old == script_sha256:
        return ""
    return f"the script's content changed since the baseline (sha256 {old[:12]} -> {script_sha256[:12]})"


def save_command(nodeid: str, args: Sequence[str] = ()) -> str:
    """The command that records `nodeid`'s baseline, each word shell-quoted: a parametrized id's brackets are a
    glob to zsh, and an id may hold spaces. `args`: the options that decide where the baseline goes (the machine
    class's world size, device, launcher ..., and the baselines folder: GateSettings.accept_args), which every
    caller must pass, else the command saves into another machine class's folder."""
    return shlex.join(["pytest", "--distperf", "--distperf-save", *args, nodeid])


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


def until_job_decided(verdicts: Callable[[], list[MetricVerdict]], runs: Callable[[], int],
                      extend: Callable[[], None] | None, budget: Budget, clock: Clock, save_mode: bool = False,
                      progress: Callable[[str], None] | None = None, label: str = "",
                      against: str = "baseline", unit: str = "runs") -> str:
    """The gate's stopping rule for one job (stopping.look_until): while a time or memory verdict is INCONCLUSIVE
    (with --distperf-save: until the budget's runs are recorded), `extend` adds a run (or a pair). Returns why it
    stopped. `against` and `unit` word the progress line."""

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
                 f"{v.interval_text()} vs +{(v.threshold or 0):.1%}), running {unit} {n + 1}-{target} "
                 f"for the look at {target}")

    last, why = stopping.look_until(verdicts, pending, lambda _: runs(), extend, budget, clock,
                                    say if progress else None, unit)
    if save_mode:
        return f"{runs()} runs recorded" if why == "decided" else why
    failed = [v.metric for v in last if v.status == "fail"]
    if why == "decided" and failed and any(is_pending(v) for v in last):
        return f"{', '.join(dict.fromkeys(failed))} failed"  # the undecided ones got no further look
    return why


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
        return save_command(nodeid, self.settings.accept_args)


def replacement(file: str, old: BaselineFile, new: BaselineFile) -> dict[str, Any]:
    """What a save over an existing baseline replaced, for the reports (GateContext.replaced): each file's
    provenance as it records it, and the jobs the old one held that the new one does not."""
    return {"file": file, "was": old.provenance(), "now": new.provenance(),
            "dropped": sorted(set(old.jobs) - set(new.jobs))}


def _provenance_text(p: dict[str, Any]) -> str:
    counts = sorted(set((p.get("runs") or {}).values()))
    runs = ("no jobs" if not counts else f"{counts[0]} run{'s' if counts[0] != 1 else ''}" if len(counts) == 1
            else f"{counts[0]}-{counts[-1]} runs")
    if len(p.get("runs") or {}) > 1:
        runs += f" a job ({len(p['runs'])} jobs)"
    return (f"{runs} (saved {p.get('saved_at') or '?'} at commit {fingerprint.commit_text(p)} on host "
            f"{p.get('host') or '?'})")


@dataclass
class GateContext:
    """What a test's verdicts were decided on and against, for the reports."""

    machine_class: str
    machine: dict[str, Any]
    environment: dict[str, Any]
    baseline_file: str | None = None
    baseline_saved_at: str | None = None
    baseline_environment: dict[str, Any] | None = None
    environment_changes: list[str] = field(default_factory=list)  # versions changed since the baseline
    saved: str | None = None  # the baseline file --distperf-save wrote
    # what that save wrote over (replacement), or where an unusable file there went; None: no file was there
    replaced: dict[str, Any] | None = None
    against: dict[str, Any] | None = None  # head vs base: BaseCheckout.to_json
    # the options that decide where the test's baseline goes (GateSettings.accept_args): save_command repeats them
    save_args: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    def replaced_text(self) -> str:
        """'<file>: replaced a baseline of 6 runs (saved ..., at commit ... on host ...) with 3 runs (...)' and
        what the new file no longer holds; '' when the save replaced none."""
        r = self.replaced
        if not r:
            return ""
        if r.get("moved_aside"):
            return (f"{r.get('file') or self.saved}: the unusable file there was moved aside to {r['moved_aside']} "
                    f"(kept, not read again: delete it once its contents are not needed; {r.get('unusable')})")
        was, now = r.get("was") or {}, r.get("now") or {}
        text = (f"{r.get('file') or self.saved}: replaced a baseline of {_provenance_text(was)} with "
                f"{_provenance_text(now)}")
        fewer = [f"{job} {n} -> {now['runs'][job]}" for job, n in (was.get("runs") or {}).items()
                 if job in (now.get("runs") or {}) and now["runs"][job] < n]
        if fewer:
            text += f"; fewer runs than before ({', '.join(fewer)})"
        if r.get("dropped"):
            text += f"; no longer holds {', '.join(r['dropped'])}"
        return text

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "GateContext | None":
        """None where a test failed before its gate read the baseline."""
        if not d.get("machine_class"):
            return None
        return cls(**{**{name: d[name] for name in cls.__dataclass_fields__ if d.get(name) is not None},
                      "machine": dict(d.get("machine") or {}), "environment": dict(d.get("environment") or {}),
                      "environment_changes": [str(c) for c in d.get("environment_changes") or []],
                      "save_args": [str(a) for a in d.get("save_args") or []]})


@dataclass
class GateOutcome:
    """What the test's report gets: failure or not, the message, JUnit properties, the context and the records."""

    failed: bool
    message: str | None
    properties: list[tuple[str, str]] = field(default_factory=list)
    context: GateContext | None = None
    records: list[MetricVerdict | DetectableChange] = field(default_factory=list)


class Gate(Protocol):
    """One test's gate: BaselineGate against the stored baselines, or against.AgainstGate head vs base."""

    budget: Budget  # the test's adaptive repeats (the fixture sets it before its first job)

    def run(self, job: JobSpec, run_once: Callable[[JobSpec, str], RunResult]) -> RunResult:
        """One run of `job` through `run_once(job, side)`: alone ("head"), or paired with its twin on the base's
        code ("base"). Returns head's run; a failure of the base side is recorded, never raised."""
        ...

    def check(self, job: JobSpec, runs: list[RunResult], extend: Callable[[], None] | None = None,
              clock: Clock | None = None, progress: Callable[[str], None] | None = None) -> list[MetricVerdict]:
        """A job's runs finished (`runs` may be shared with other tests, and grow). While a time or memory verdict
        is INCONCLUSIVE, `extend` adds a run (or a pair), up to `budget`. Returns the verdicts as they stand."""
        ...

    def finish(self, test_passed: bool) -> GateOutcome:
        """The test ended: every job decided on all its runs."""
        ...


class BaselineGate:
    """The Gate against one test's stored baseline, read at fixture setup (a bad file fails the test before any job
    starts), saved when the test ends with --distperf-save if it passed."""

    def __init__(self, session: GateSession, nodeid: str, device: str, world_size: int, policy: Policy,
                 nodes: int = 1, inter_node: str = "none", test_file: str | None = None):
        self.session, self.nodeid, self.policy, self.device = session, nodeid, policy, device
        self.machine = session.machine(device, world_size, nodes, inter_node)
        self.environment = session.environment(device)
        self.key = session.store.key_for(test_file, nodeid) if test_file else nodeid
        self.path = session.store.path_for(self.machine.name, self.key)
        try:
            self.baseline: BaselineFile | None = session.store.load(self.path, self.key)  # BaselineError
        except BaselineReplaceable:
            if not session.settings.save:
                raise
            self.baseline = None  # --distperf-save: moved aside when the new one is written (Store.save_over)
        # No file, but the folder holds others: said when a job is decided (a test with no gated job stays quiet).
        self.unmatched = None if self.baseline else session.store.unmatched_note(self.machine.name, self.key)
        self.unmatched_said = False
        self.env_changes = (fingerprint.soft_differences(self.baseline.environment, self.environment)
                            if self.baseline else [])
        if self.env_changes:
            warn(BaselineEnvironmentWarning(
                f"{os.path.relpath(self.path, session.rootdir)}: recorded with other versions than this run: "
                f"{', '.join(self.env_changes)}"))
        self.jobs: dict[str, JobRuns] = {}  # by key: the label, plus the injection knobs when the job carries any
        self.identity: dict[str, tuple[str, str, dict[str, Any]]] = {}  # key -> (clean label, config hash, config)
        self.scripts: dict[str, str] = {}  # key -> a script job's file hash (the config leaves it out)
        self.verdicts: list[MetricVerdict] = []
        self.stopped: dict[str, str] = {}  # job key -> why it got no more runs
        self.budget = Budget()

    @property
    def save_mode(self) -> bool:
        return self.session.settings.save

    def _job(self, job: JobSpec) -> JobRuns:
        """The job as the baseline keys it: the same label with another configuration gets '#2', '#3' ... (stable
        by order); a job with injected work is keyed apart from the clean one (' +extra_work=0.4')."""
        label, config_hash, config, injection = job_identity(job)
        n, base = 1, label
        while base in self.identity and self.identity[base][1] != config_hash:
            n += 1
            base = f"{label} #{n}"
        key = base + injection
        self.identity.setdefault(key, (base, config_hash, config))
        if job.script is not None and job.script.sha256:
            self.scripts.setdefault(key, job.script.sha256)
        return self.jobs.setdefault(key, JobRuns(key))

    def _entry(self, key: str) -> JobEntry | None:
        """The job's stored entry; a job with injected work falls back to its clean job's (a slowdown reads as a
        regression of the same job, as a code change would)."""
        if self.baseline is None:
            return None
        return self.baseline.jobs.get(key) or self.baseline.jobs.get(self.identity[key][0])

    def _decide(self, m: JobRuns) -> list[MetricVerdict]:
        _, config_hash, config = self.identity[m.label]
        reason = (f"no baseline for this test on machine class {self.machine.name}" if self.baseline is None
                  else "this job is not in the baseline" + nearest_job(self.baseline.jobs, config))
        if self.unmatched:
            reason = self.unmatched
            if not self.unmatched_said:  # once per test; every verdict keeps the note
                self.unmatched_said = True
                warn(BaselineUnmatchedWarning(f"{self.nodeid}: {self.unmatched}"))
        out = decide_job(self.nodeid, m.label, self._entry(m.label), config_hash, metrics_from_runs(m.runs),
                         self.policy, reason, self.budget.design(), self.device, config, self.scripts.get(m.label))
        for v in out:
            v.stopped = self.stopped.get(m.label, "")
        if m.runs:
            note_deciding_figure(out, m.figures)
        return out

    def run(self, job: JobSpec, run_once: Callable[[JobSpec, str], RunResult]) -> RunResult:
        return run_once(job, "head")  # no base side: each run alone

    def check(self, job: JobSpec, runs: list[RunResult], extend: Callable[[], None] | None = None,
              clock: Clock | None = None, progress: Callable[[str], None] | None = None) -> list[MetricVerdict]:
        """Gate.check; with --distperf-save `extend` adds runs up to the budget's count instead."""
        m = self._job(job)
        m.add(runs)
        self.stopped.pop(m.label, None)  # an earlier check's stop (shared runs) is not this one's
        self.stopped[m.label] = until_job_decided(lambda: self._decide(m), lambda: len(m.runs), extend, self.budget,
                                                  clock or Clock(), self.save_mode, progress, m.label)
        return self._decide(m)

    def finish(self, test_passed: bool) -> GateOutcome:
        """Decide every job on all its runs; save (with --distperf-save, when the test passed) or decide
        whether the verdicts fail the test. An INCONCLUSIVE verdict warns (fails with --distperf-strict)."""
        self.verdicts = [v for m in self.jobs.values() if m.runs for v in self._decide(m)]
        if not self.save_mode:
            self._explain()
        context = self._context()
        props = [(f"distperf.baseline.{v.metric}[{v.job}]", property_text(v)) for v in self.verdicts]
        records: list[MetricVerdict | DetectableChange] = [v.landed(self.policy, enforced=not self.save_mode)
                                                     for v in self.verdicts]
        if self.save_mode:
            if not test_passed or not self.jobs:
                return GateOutcome(False, None, props, context, records)
            jobs = {key: JobEntry(label=key, config_hash=self.identity[key][1], config=self.identity[key][2],
                                  metrics=metrics_from_runs(m.runs), explain=explain_tables(m.runs),
                                  script_sha256=self.scripts.get(key))
                    for key, m in self.jobs.items()}
            try:
                saved = self._save(jobs)
            except BaselineError as e:
                return GateOutcome(True, f"distperf --distperf-save: {e}", props, context, records)
            context.saved = saved.path
            props.append(("distperf.baseline.saved", saved.path))
            file = os.path.relpath(saved.path, self.session.rootdir)
            if saved.replaced is not None:  # never unsaid: the reports name what the file held
                context.replaced = replacement(file, saved.replaced, saved.written)
            elif saved.aside is not None:  # an unusable file (a merge conflict, a truncated write) kept beside it
                context.replaced = {"file": file, "unusable": saved.unusable,
                                    "moved_aside": os.path.relpath(saved.aside, self.session.rootdir)}
            if context.replaced:
                props.append(("distperf.baseline.replaced", context.replaced_text()))
            return GateOutcome(False, None, props, context, records + self._detectable_changes(saved.path, jobs))
        for v in self.verdicts:
            if v.status == "inconclusive" and not self.policy.strict:
                warn(DistPerfInconclusive(f"{self.nodeid}: baseline {describe_verdict(v, self.policy)[0]}; "
                                          f"{v.note}"))
        failing = [v for v in self.verdicts if is_failing(v, self.policy)]
        return GateOutcome(bool(failing), self._message(failing) if failing else None, props, context, records)

    def _explain(self) -> None:
        """What changed by operator/kernel on each failed verdict against a stored entry (every one with explain)."""
        by_job: dict[str, dict[str, Any]] = {}
        for v in self.verdicts:
            if v.baseline is None or not (v.status == "fail" or self.policy.explain):
                continue
            if v.job not in by_job:
                entry, runs = self._entry(v.job), self.jobs[v.job].runs
                stored = entry.explain if entry is not None and entry.explain is not None else [None]
                failed = [(u.metric, u.metric_kind) for u in self.verdicts if u.job == v.job and u.status == "fail"]
                by_job[v.job] = explain(stored, explain_tables(runs) or [None], *explain_by(failed)).to_json()
            v.explanation = by_job[v.job]

    def _detectable_changes(self, path: str, jobs: dict[str, JobEntry]) -> list[DetectableChange]:
        """What the saved file lets later runs decide, per job and metric; a warning for each that cannot pass."""
        rel = os.path.relpath(path, self.session.rootdir)
        found = [r for key, entry in jobs.items()
                 for r in detectable_changes(key, entry.metrics, self.policy, self.budget.design(), self.device)]
        for r in found:
            if not r.can_pass:
                warn(BaselineNoisyWarning(
                    f"{self.nodeid}: saved {rel}, but {r.text()}: record it on a quieter machine, or with more "
                    f"runs (--distperf-max-repeats)"))
        return [r.saved_as(self.nodeid, rel) for r in found]

    def _save(self, jobs: dict[str, JobEntry]) -> Saved:
        doc = BaselineFile(test=self.key, machine_class=self.machine.name, machine=self.machine.to_dict(),
                           environment=self.environment, saved_at=now_iso(), jobs=jobs)
        saved = self.session.store.save_over(doc)
        if saved.aside:
            warn(BaselineReplacedWarning(
                f"{self.nodeid}: the baseline {os.path.relpath(self.path, self.session.rootdir)} could not be "
                f"used ({saved.unusable}); moved it aside to {os.path.basename(saved.aside)} (nothing deleted) and "
                f"saved a new one"))
        return saved

    def _context(self) -> GateContext:
        return GateContext(
            machine_class=self.machine.name, machine=self.machine.to_dict(), environment=self.environment,
            baseline_file=self.path, baseline_saved_at=self.baseline.saved_at if self.baseline else None,
            baseline_environment=self.baseline.environment if self.baseline else None,
            environment_changes=list(self.env_changes), save_args=list(self.session.settings.accept_args))

    def _message(self, failing: list[MetricVerdict]) -> str:
        rel = os.path.relpath(self.path, self.session.rootdir)
        lines = [f"distperf baseline gate failed for {self.nodeid} (machine class {self.machine.name}):",
                 *failure_lines(failing, self.policy)]
        if self.baseline is not None:
            env = self.baseline.environment
            lines.append(f"  baseline: {rel}, saved {self.baseline.saved_at or '?'} at commit "
                         f"{fingerprint.commit_text(env)} on host {env.get('host') or '?'}")
            if self.env_changes:
                lines.append(f"  versions changed since the baseline: {', '.join(self.env_changes)}")
        else:
            lines.append(f"  baseline file (missing): {rel}")
        lines += ["  to accept the current numbers as the new baseline, run:",
                  f"    {self.session.accept_command(self.nodeid)}"]
        return "\n".join(lines)
