"""Head against base in one session (--distperf-against=REF): every job runs as interleaved pairs, on HEAD's code and
on REF's, and each gated metric is decided on the pairs with the gate's limits. Pairs run back to back cancel the
machine drift that unpaired runs against stored baselines read as a change.

The base side is a `git worktree` of REF (the merge base of REF and HEAD unless --distperf-against-exact); its ranks
import the project from there while the harness stays HEAD's. What cannot be compared says so and never reads as a
regression of HEAD: a missing REF (a usage error), extensions built in place, a test file new at HEAD ("new"), a
job failing on the base side ("not comparable").
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, replace
from typing import Any, Callable

from pytest_distperf.errors import SessionBudgetSpent, SettingsError
from pytest_distperf.launch import fingerprint
from pytest_distperf.launch.fingerprint import MachineClass
from pytest_distperf.decide.policy import Policy
from pytest_distperf.decide.regression import GateContext, GateOutcome, note_deciding_figure, until_job_decided
from pytest_distperf.decide.verdicts import (MetricVerdict, decide_metric, failure_lines, is_failing, job_metrics,
                                             property_text, secondary_text, set_job_runs)
from pytest_distperf.store.baselines import explain_tables, job_identity, metrics_from_runs
from pytest_distperf.decide import decision
from pytest_distperf.decide.stopping import Budget, Clock
from pytest_distperf.launch.outcomes import PYTEST_OUTCOMES
from pytest_distperf.figures.explain import explain, explain_by
from pytest_distperf.figures.quantities import JobRuns
from pytest_distperf.rank.results import RunResult
from pytest_distperf.spec.job import FunctionRef, JobSpec, ScriptRef, file_sha256

COMPILED_SOURCES = (".pyx", ".pxd", ".c", ".cc", ".cpp", ".cxx", ".cu")
BUILT_EXTENSIONS = (".so", ".pyd")
SKIPPED_DIRS = {".git", ".venv", "venv", "build", "dist", "node_modules", "site-packages", "__pycache__"}


def _git(root: str, *args: str) -> str:
    done = subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, ["git", *args], done.stdout, done.stderr)
    return done.stdout.strip()


@dataclass(frozen=True)
class BaseCheckout:
    """REF's code beside HEAD's for one session."""

    ref: str
    exact: bool  # REF itself (--distperf-against-exact), else the merge base of REF and HEAD
    head_commit: str
    base_commit: str
    repo_root: str  # HEAD's repository (its top level)
    worktree: str  # REF's checkout
    harness_dir: str  # holds only a link to HEAD's pytest_distperf: first on the base side's sys.path
    dirty: str = ""  # `git diff --stat HEAD`: what HEAD's side runs beyond its commit
    problem: str = ""  # why no job can be compared ("" none)

    def label(self) -> str:
        """'head 1a2b3c4d5e6f + uncommitted changes vs base 9f8e7d6c5b4a (merge base of main and HEAD)'."""
        head = fingerprint.describe_commit(self.head_commit, bool(self.dirty))
        how = f"{self.ref}" if self.exact else f"merge base of {self.ref} and HEAD"
        return f"head {head} vs base {self.base_commit[:12]} ({how})"

    def to_json(self) -> dict[str, Any]:
        return {"ref": self.ref, "exact": self.exact, "head_commit": self.head_commit,
                "base_commit": self.base_commit, "worktree": self.worktree, "dirty": self.dirty,
                "problem": self.problem, "label": self.label()}

    def moved(self, path: str) -> str:
        """A path inside HEAD's repository as the same path in the base worktree; any other path as it is."""
        real = os.path.realpath(path) if path else path
        if real and (real == self.repo_root or real.startswith(self.repo_root + os.sep)):
            return os.path.join(self.worktree, os.path.relpath(real, self.repo_root))
        return path

    def _ref(self, ref: FunctionRef | None) -> FunctionRef | None:
        if ref is None or not ref.file:
            return ref
        return dataclasses.replace(ref, file=self.moved(ref.file))

    def _script(self, script: ScriptRef | None) -> ScriptRef | None:
        if script is None:
            return None
        path = self.moved(script.path)
        sha256 = file_sha256(path) if os.path.isfile(path) else ""  # missing at base: that side fails naming it
        return dataclasses.replace(script, path=path, cwd=self.moved(script.cwd) if script.cwd else None,
                                   sha256=sha256)

    def base_job(self, job: JobSpec) -> JobSpec:
        """The same job on REF's code: the configuration (and so its hash) unchanged, the import paths moved."""
        src = os.path.join(self.worktree, "src")
        first = [self.harness_dir, self.worktree] + ([src] if os.path.isdir(src) else [])
        path = list(dict.fromkeys(first + [self.moved(p) for p in job.sys_path if p]))
        return dataclasses.replace(job, sys_path=path, workload=self._ref(job.workload), step=self._ref(job.step),
                                   function=self._ref(job.function), script=self._script(job.script))

    def missing_at_base(self, test_file: str | None) -> bool:
        moved = self.moved(test_file or "")
        return bool(test_file) and moved != test_file and not os.path.exists(moved)

    def remove(self) -> None:
        try:
            _git(self.repo_root, "worktree", "remove", "--force", self.worktree)
        except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired):
            shutil.rmtree(self.worktree, ignore_errors=True)
            with contextlib.suppress(subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired):
                _git(self.repo_root, "worktree", "prune")
        shutil.rmtree(os.path.dirname(self.harness_dir), ignore_errors=True)


def _compiled_problem(repo_root: str, base_commit: str) -> str:
    """Extensions built in place in HEAD's tree from sources the base tracks: REF's checkout has none built."""
    tracked = _git(repo_root, "ls-tree", "-r", "--name-only", base_commit).splitlines()
    sources = [f for f in tracked if f.endswith(COMPILED_SOURCES)]
    if not sources:
        return ""
    built = []
    for folder, dirs, files in os.walk(repo_root):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".")]
        built += [os.path.relpath(os.path.join(folder, f), repo_root) for f in files if f.endswith(BUILT_EXTENSIONS)]
        if len(built) >= 3:
            break
    if not built:
        return ""
    return (f"the project builds compiled extensions in place ({', '.join(sorted(built)[:3])} from "
            f"{', '.join(sources[:3])}); REF's checkout would need its own build, which the plugin does not make: "
            f"build REF in its own checkout and compare with the stored-baseline gate")


def prepare(start: str, ref: str, exact: bool = False, parent: str | None = None) -> BaseCheckout:
    """A worktree of REF (or of the merge base of REF and HEAD) for the repository `start` lies in."""
    flag = "--distperf-against"
    try:
        root = os.path.realpath(_git(start, "rev-parse", "--show-toplevel"))
    except (subprocess.CalledProcessError, OSError) as e:
        raise SettingsError(f"{flag}={ref}: {start} is not inside a git repository "
                            f"({getattr(e, 'stderr', '') or e})".strip()) from None

    def git(problem: str, *args: str) -> str:
        try:
            return _git(root, *args)
        except subprocess.CalledProcessError:
            raise SettingsError(f"{flag}={ref}: {problem}") from None

    head = git(f"the repository {root} has no commit yet", "rev-parse", "--verify", "HEAD^{commit}")
    base = git(f"no commit {ref!r} in {root} (a branch, tag or commit; fetch it first in a shallow clone)",
               "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    if not exact:
        base = git(f"{ref} and HEAD have no merge base (unrelated histories); --distperf-against-exact compares "
                   f"against {ref} itself", "merge-base", base, head)
    dirty = _git(root, "diff", "--stat", "HEAD")
    folder = tempfile.mkdtemp(prefix="distperf-against-", dir=parent)
    worktree = os.path.join(folder, f"base-{base[:12]}")
    try:
        _git(root, "worktree", "add", "--detach", "--quiet", worktree, base)
    except subprocess.CalledProcessError as e:
        shutil.rmtree(folder, ignore_errors=True)
        raise SettingsError(f"{flag}={ref}: git worktree add of {base[:12]} failed: {e.stderr.strip()}") from None
    harness = os.path.join(folder, "harness")
    os.makedirs(harness)
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # HEAD's pytest_distperf
    os.symlink(package, os.path.join(harness, "pytest_distperf"))
    return BaseCheckout(ref=ref, exact=exact, head_commit=head, base_commit=base, repo_root=root,
                        worktree=worktree, harness_dir=harness, dirty=dirty, problem=_compiled_problem(root, base))


def decide_pairs(test: str, job: str, pairs: list[tuple[RunResult, RunResult]], policy: Policy,
                 design: decision.Design) -> list[MetricVerdict]:
    """Each gated metric of head against base on the pairs, as the baseline gate decides it."""
    head = metrics_from_runs([h for h, _ in pairs])
    base = metrics_from_runs([b for _, b in pairs])
    device = pairs[0][0].spec.device if pairs else None
    out = []
    for name in job_metrics(head, policy, device):
        if name not in base:
            continue
        v = decide_metric(test, job, name, base[name], head[name], policy, design, paired=True)
        v.secondary = secondary_text(name, device, base, head, ("base", "head"))
        out.append(v)
    set_job_runs(out, base, head)
    return out


class AgainstGate:
    """The Gate of one test head vs base: each run of a job is paired with its twin on the base's code (head then
    base, then base then head)."""

    def __init__(self, checkout: BaseCheckout, nodeid: str, policy: Policy, machine: MachineClass,
                 environment: dict[str, Any], test_file: str | None = None):
        self.checkout, self.nodeid, self.policy = checkout, nodeid, policy
        self.machine, self.environment = machine, environment
        self.new_reason = (f"the test file does not exist at base {checkout.base_commit[:12]}"
                           if checkout.missing_at_base(test_file) else "")
        self.jobs: dict[str, JobRuns] = {}  # head's runs and their base twins
        self.budget = Budget()
        self.stopped: dict[str, str] = {}

    def _job(self, job: JobSpec) -> JobRuns:
        key = job.describe() + "#" + job.config_hash()
        return self.jobs.setdefault(key, JobRuns(job_identity(job)[0], [[]]))  # one list: head's runs of the pairs

    def _paired(self, paired: JobRuns) -> bool:
        return not (self.new_reason or self.checkout.problem or paired.base_error)

    def run(self, job: JobSpec, run_once: Callable[[JobSpec, str], RunResult]) -> RunResult:
        paired = self._job(job)
        if not self._paired(paired):
            return run_once(job, "head")
        head_first = len(paired.base_runs) % 2 == 0  # what drifts within a pair hits both orders alike
        head = run_once(job, "head") if head_first else None
        base = None
        try:
            base = run_once(self.checkout.base_job(job), "base")
        except SessionBudgetSpent:
            raise  # not the base side's failure: the pair is not run
        except (Exception, *PYTEST_OUTCOMES) as e:  # the base side's failure is not HEAD's
            lines = [line for line in str(getattr(e, "msg", None) or e).strip().splitlines() if line.strip()]
            paired.base_error = "\n".join(lines[:3])[:600] or "failed"
        if head is None:
            head = run_once(job, "head")
        if base is not None:
            paired.sources[0].append(head)
            paired.base_runs.append(base)
        return head

    def _decide(self, job: JobRuns) -> list[MetricVerdict]:
        if not job.base_runs:
            status, note = (("new", self.new_reason) if self.new_reason else
                            ("not comparable", self.checkout.problem or
                             f"the job failed on the base side: {job.base_error}; not a regression of HEAD"))
            return [MetricVerdict(test=self.nodeid, job=job.label, metric="step_time", metric_kind="time", unit="s",
                                  direction="lower", status=status, note=note)]
        out = decide_pairs(self.nodeid, job.label, list(zip(job.runs, job.base_runs)), self.policy,
                           self.budget.design())
        for v in out:
            v.stopped = self.stopped.get(job.label, "")
            if job.base_error:
                v.note += f"; the base side failed after {len(job.base_runs)} pair(s): {job.base_error}"
        note_deciding_figure(out, job.figures)
        return out

    def check(self, job: JobSpec, runs: list[RunResult], extend: Callable[[], None] | None = None,
              clock: Clock | None = None, progress: Callable[[str], None] | None = None) -> list[MetricVerdict]:
        paired = self._job(job)
        if self._paired(paired):
            self.stopped.pop(paired.label, None)  # an earlier check's stop (shared runs) is not this one's
            self.stopped[paired.label] = until_job_decided(
                lambda: self._decide(paired), lambda: len(paired.base_runs), extend, self.budget, clock or Clock(),
                False, progress, paired.label, against="head vs base", unit="pairs")
        return self._decide(paired)

    def _explain(self, job: JobRuns, verdicts: list[MetricVerdict]) -> None:
        """What changed by operator/kernel on a failed verdict (every one with explain): head's runs against their
        base twins' tables."""
        shown = [v for v in verdicts if v.status == "fail" or (self.policy.explain and v.baseline is not None)]
        if shown and job.base_runs:
            by = explain_by([(v.metric, v.metric_kind) for v in verdicts if v.status == "fail"])
            diff = explain(explain_tables(job.base_runs) or [None], explain_tables(job.runs) or [None], *by).to_json()
            for v in shown:
                v.explanation = diff

    def finish(self, test_passed: bool) -> GateOutcome:
        verdicts = []
        for job in self.jobs.values():
            decided = self._decide(job)
            self._explain(job, decided)
            verdicts += decided
        records: list[Any] = [replace(v.landed(self.policy), reference=self.checkout.label(),
                                      head_commit=self.checkout.head_commit, base_commit=self.checkout.base_commit)
                              for v in verdicts]
        props = [(f"distperf.against.{v.metric}[{v.job}]", property_text(v)) for v in verdicts]
        failing = [v for v in verdicts if is_failing(v, self.policy)]
        message = "\n".join([f"distperf head vs base failed for {self.nodeid} ({self.checkout.label()}):",
                             *failure_lines(failing, self.policy, ("base", "head"))]) if failing else None
        context = GateContext(machine_class=self.machine.name, machine=self.machine.to_dict(),
                              environment=self.environment, against=self.checkout.to_json())
        return GateOutcome(bool(failing), message, props, context, records)
