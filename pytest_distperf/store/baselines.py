"""The baseline store: one JSON file per test under `<baselines>/<machine-class>/`.

A file holds, per job the test measured (keyed by its label plus any injection knobs: ' +extra_work=0.4'), the
hash of the job's configuration and, per metric, its unit, direction, kind, one value per run and each run's raw
step samples; `explain` (optional, so the format stays version 1) holds each run's operator/kernel table, what a
failing verdict's "what changed" is diffed against; `script_sha256` (optional too) a script job's file hash. The
environment's `git_dirty`/`git_dirty_files` (optional, version 1 still) say the save ran uncommitted changes on top
of `git_commit`; a file without them names its commit as it always did.

Reading never writes: an unusable file raises BaselineError naming it and stays byte-identical; an older format
is brought up to date in memory. What picks the decision rule is not taken on the file's word: a known metric's
kind and direction must be its definition's, and the file's machine class its folder's. Writes are atomic under
the folder's lock, so concurrent writers (xdist workers, two sessions) never lose or tear an entry; a save says
what it replaced (Saved), so no baseline is overwritten unsaid.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import re
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable

from pytest_distperf.errors import BaselineError, FileError
from pytest_distperf.fs import jsonio
from pytest_distperf.spec.job import INJECTION_FIELDS, JobSpec
from pytest_distperf.rank.results import RunResult
from pytest_distperf.rank.time_table import FLOPS, Table, run_table
from pytest_distperf.figures.quantities import (KNOWN_METRICS, geometric_mean, metric_traits, metric_values,
                                                run_figures)
from pytest_distperf.figures.stats import relative_spread

FORMAT = jsonio.Format("baseline")

DIRECTIONS = ("lower", "higher")
KINDS = ("time", "memory", "count")
MAX_BASELINE_BYTES = 8 << 20  # 8 MiB; 12 runs x 100 steps x 20 jobs is about 1 MiB: larger is not a baseline


class BaselineReplaceable(BaselineError):
    """A baseline whose contents cannot be used: --distperf-save moves it aside and writes a new one."""


class BaselineTooNew(BaselineError):
    """A baseline of a newer format: left alone also by --distperf-save (a newer pytest-distperf reads it)."""


def read_json(path: str) -> Any:
    """jsonio.read_json (at most MAX_BASELINE_BYTES) with a baseline file's error types."""
    try:
        return jsonio.read_json(path, max_bytes=MAX_BASELINE_BYTES)
    except jsonio.CorruptFileError as e:
        raise BaselineReplaceable(str(e)) from None
    except FileError as e:
        raise BaselineError(str(e)) from None


def write_json_atomic(path: str, obj: Any) -> None:
    """jsonio.write_json_atomic under the folder's lock, with a baseline file's error type."""
    try:
        jsonio.write_json_atomic(path, obj, lock=True)
    except FileError as e:
        raise BaselineError(str(e)) from None


# -- what is stored ---------------------------------------------------------------------------------------------
@dataclass
class MetricSeries:
    unit: str
    direction: str  # "lower" or "higher" is better
    kind: str  # "time" | "memory" | "count"
    runs: list[float]  # one value per run: step time, peak bytes, a count
    samples: list[list[float]] | None = None  # raw per-step values of each run (time metrics)

    @property
    def center(self) -> float:
        """The job's figure: the geometric mean of the runs; a count's median."""
        return statistics.median(self.runs) if self.kind == "count" else geometric_mean(self.runs)

    @property
    def variation(self) -> float | None:
        """Run-to-run variation (stats.relative_spread of the run values)."""
        return relative_spread(self.runs)

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "direction": self.direction, "kind": self.kind, "runs": list(self.runs),
                "samples": self.samples, "summary": {"n": len(self.runs), "center": self.center, "min": min(self.runs),
                                                     "max": max(self.runs), "variation": self.variation}}


@dataclass
class JobEntry:
    label: str
    config_hash: str
    config: dict[str, Any]
    metrics: dict[str, MetricSeries]
    explain: list[Table] | None = None  # each run's operator/kernel table; None: saved before tables existed
    # A script job's file hash: not part of the config (a changed script is gated against its baseline), kept so
    # a verdict can say the script changed. None: not a script job, or saved before it was kept.
    script_sha256: str | None = None

    @property
    def runs(self) -> int:
        """The runs the job was recorded over (its metrics' most: a count may be missing from a run)."""
        return max((len(m.runs) for m in self.metrics.values()), default=0)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"config_hash": self.config_hash, "config": self.config,
                             "metrics": {k: m.to_dict() for k, m in self.metrics.items()}}
        if self.explain is not None:
            d["explain"] = self.explain
        if self.script_sha256:
            d["script_sha256"] = self.script_sha256
        return d

    def config_changes(self, config: dict[str, Any]) -> list[str]:
        """The fields where `config` (the job now) differs from the stored one, each 'path old -> new' with the
        values shortened: 'steps 8 -> 16', 'script.args ["--steps", "200"] -> [...]'. Empty when the stored entry
        holds no config (an old file) or none differs."""
        return _differences(self.config, config) if self.config else []


_UNSET = object()


def _differences(old: Any, new: Any, where: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [line for key in sorted(set(old) | set(new), key=str)
                for line in _differences(old.get(key, _UNSET), new.get(key, _UNSET),
                                         f"{where}.{key}" if where else str(key))]
    if old == new:
        return []
    shown = lambda v: "(unset)" if v is _UNSET else _short(v, 40)  # noqa: E731
    return [f"{where or 'config'} {shown(old)} -> {shown(new)}"]


@dataclass
class BaselineFile:
    test: str  # the pytest node id
    machine_class: str
    machine: dict[str, Any]
    environment: dict[str, Any]
    saved_at: str
    jobs: dict[str, JobEntry] = field(default_factory=dict)

    def provenance(self) -> dict[str, Any]:
        """What a report says of the file, as it records it: when, at which commit, on which host, each job's runs."""
        env = self.environment
        dirty = {k: env[k] for k in ("git_dirty", "git_dirty_files") if env.get(k) is not None}
        return {"saved_at": self.saved_at or None, "git_commit": env.get("git_commit") or None, **dirty,
                "host": env.get("host") or None,
                "runs": {label: job.runs for label, job in self.jobs.items()}}

    def to_dict(self) -> dict[str, Any]:
        return FORMAT.stamp({"test": self.test, "machine_class": self.machine_class,
                "machine": self.machine, "environment": self.environment, "saved_at": self.saved_at,
                "jobs": {label: j.to_dict() for label, j in self.jobs.items()}})


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


# -- from runs --------------------------------------------------------------------------------------------------
def job_identity(job: JobSpec) -> tuple[str, str, dict[str, Any], str]:
    """(label, config hash, config, injection) of a job as the baseline keys it: the hash and config leave the
    injection knobs out, `injection` names them, so an injected job and the clean one never share a series."""
    return job.describe(), job.config_hash(INJECTION_FIELDS), job.label_config(), injection_suffix(job)


def injection_suffix(job: JobSpec) -> str:
    """' +extra_work=0.4' for a job with injected work ('' for none): part of its name in every report."""
    knobs = sorted((k, v) for k, v in job.shape_overrides.items() if k in INJECTION_FIELDS and v)
    return "".join(f" +{k}={v:g}" if isinstance(v, (int, float)) else f" +{k}={v}" for k, v in knobs)


def metrics_from_runs(runs: list[RunResult]) -> dict[str, MetricSeries]:
    """The gated metrics of a job's runs, with each run's raw step samples for step time."""
    values = metric_values([run_figures(r) for r in runs])
    out = {}
    for name, runs_values in values.items():
        unit, direction, kind = metric_traits(name)
        out[name] = MetricSeries(unit=unit, direction=direction, kind=kind, runs=runs_values,
                                 samples=[list(r.step_times) for r in runs] if name == "step_time" else None)
    return out


def explain_tables(runs: list[RunResult]) -> list[Table] | None:
    """Each run's operator/kernel table; None unless every run has one. The flops: rows (exact, from the first
    run that has them) go into every run's table."""
    tables = [run_table([r.work.explain if r.work is not None else None for r in run.ranks]) for run in runs]
    if not tables or any(t is None for t in tables):
        return None
    modules = next(({n: v for n, v in t.items() if n.startswith(FLOPS)} for t in tables
                    if t is not None and any(n.startswith(FLOPS) for n in t)), {})
    return [{**t, **modules} for t in tables if t is not None]


# -- reading, with validation ----------------------------------------------------------------------------------
class _Check:
    """Type checks that name the file and the place inside it."""

    def __init__(self, path: str):
        self.path = path

    def fail(self, where: str, expected: str, got: Any) -> BaselineError:
        return BaselineError(f"{self.path}: wrong type at {where}: expected {expected}, got "
                             f"{type(got).__name__} {_short(got)}; fix or delete the file "
                             f"(--distperf-save writes a new one)")

    def obj(self, v: Any, where: str) -> dict[str, Any]:
        if not isinstance(v, dict):
            raise self.fail(where, "an object", v)
        return v

    def str_(self, v: Any, where: str) -> str:
        if not isinstance(v, str):
            raise self.fail(where, "a string", v)
        return v

    def number(self, v: Any, where: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self.fail(where, "a finite number", v)
        return float(v)

    def measurements(self, v: Any, where: str, kind: str, nonempty: bool = True) -> list[float]:
        """Measured values: finite, never negative, and a time above zero (a 0 s step was never measured)."""
        if not isinstance(v, list) or (nonempty and not v):
            raise self.fail(where, "a non-empty list of numbers" if nonempty else "a list of numbers", v)
        values = [self.number(x, f"{where}[{i}]") for i, x in enumerate(v)]
        for i, x in enumerate(values):
            if x < 0 or (kind == "time" and x == 0):
                raise self.fail(f"{where}[{i}]", "a positive time" if kind == "time" else "a number >= 0", x)
        return values

    def summary(self, v: Any, where: str) -> None:
        """The stored summary (recomputed when read): every number finite and >= 0, so a corrupted one is noticed."""
        if v is None:
            return
        for key, x in self.obj(v, where).items():
            if x is not None:
                self.measurements([x], f"{where}.{key}", "count")

    def choice(self, v: Any, where: str, allowed: tuple[str, ...]) -> str:
        if v not in allowed:
            raise self.fail(where, f"one of {list(allowed)}", v)
        return v


def _explain(check: _Check, v: Any, where: str) -> list[Table] | None:
    """A job's stored run tables: a list of {row: [count, seconds]}; absent in a file saved before them."""
    if v is None:
        return None
    if not isinstance(v, list):
        raise check.fail(where, "a list of tables", v)
    tables = []
    for i, table in enumerate(v):
        rows = {}
        for name, pair in check.obj(table, f"{where}[{i}]").items():
            values = check.measurements(pair, f"{where}[{i}][{name!r}]", "count")
            if len(values) != 2:
                raise check.fail(f"{where}[{i}][{name!r}]", "[count, seconds]", pair)
            rows[name] = values
        tables.append(rows)
    return tables


def _non_finite(doc: Any, where: str = "the top level") -> str | None:
    """Where in a parsed document a NaN or infinity sits (the first one), else None."""
    if isinstance(doc, float) and not math.isfinite(doc):
        return where
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for key, value in items:
        inner = f"[{key!r}]" if isinstance(doc, dict) else f"[{key}]"
        found = _non_finite(value, inner if where == "the top level" else where + inner)
        if found is not None:
            return found
    return None


def _short(v: Any, limit: int = 60) -> str:
    text = json.dumps(v, default=repr)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _check_traits(path: str, where: str, name: str, kind: str, direction: str) -> None:
    """A known metric's stored kind and direction are its definition's (figures/quantities.py): they pick the
    decision rule, so an edited one (step_time as "memory") would judge the metric by another rule."""
    if name not in KNOWN_METRICS and not name.startswith("comms."):
        return  # a metric this code does not define: the file's traits are all there is
    _unit, known_direction, known_kind = metric_traits(name)
    for field_name, stored, known in (("kind", kind, known_kind), ("direction", direction, known_direction)):
        if stored != known:
            raise BaselineError(f"{path}: {where}.{field_name} is {stored!r}, but {name} is a {known_kind} metric "
                                f"where {known_direction} is better ({field_name} {known!r}); distperf never writes "
                                f"another: the file was edited -- fix or delete it (--distperf-save writes a new one)")


def parse(doc: Any, path: str) -> BaselineFile:
    """Validate (and bring up to date) a parsed baseline document; BaselineError naming the file on any problem."""
    check = _Check(path)
    doc = check.obj(doc, "the top level")
    where = _non_finite(doc)
    if where is not None:  # JSON has no NaN or Infinity; Python's reader accepts them, so say so here
        raise BaselineError(f"{path}: holds a non-finite number (NaN or Infinity) at {where}; distperf never "
                            f"writes one: the file was edited or corrupted -- fix or delete it "
                            f"(--distperf-save writes a new one)")
    try:
        doc = FORMAT.load(doc, path)
    except jsonio.FormatVersionError as e:
        raise BaselineTooNew(str(e)) from None
    except FileError as e:
        raise BaselineError(f"{e}; fix or delete the file") from None

    jobs: dict[str, JobEntry] = {}
    for label, job in check.obj(doc.get("jobs"), "jobs").items():
        at = f"jobs[{label!r}]"
        job = check.obj(job, at)
        metrics: dict[str, MetricSeries] = {}
        for name, m in check.obj(job.get("metrics"), f"{at}.metrics").items():
            mat = f"{at}.metrics[{name!r}]"
            m = check.obj(m, mat)
            kind = check.choice(m.get("kind"), f"{mat}.kind", KINDS)
            samples = m.get("samples")
            if samples is not None:
                if not isinstance(samples, list):
                    raise check.fail(f"{mat}.samples", "a list of lists of numbers or null", samples)
                samples = [check.measurements(s, f"{mat}.samples[{i}]", kind, nonempty=False)
                           for i, s in enumerate(samples)]
            check.summary(m.get("summary"), f"{mat}.summary")
            direction = check.choice(m.get("direction"), f"{mat}.direction", DIRECTIONS)
            _check_traits(path, mat, name, kind, direction)
            metrics[name] = MetricSeries(
                unit=check.str_(m.get("unit"), f"{mat}.unit"), direction=direction,
                kind=kind, runs=check.measurements(m.get("runs"), f"{mat}.runs", kind), samples=samples)
        script = job.get("script_sha256")
        jobs[label] = JobEntry(label=label, config_hash=check.str_(job.get("config_hash"), f"{at}.config_hash"),
                               config=check.obj(job.get("config", {}), f"{at}.config"), metrics=metrics,
                               explain=_explain(check, job.get("explain"), f"{at}.explain"),
                               script_sha256=None if script is None else check.str_(script, f"{at}.script_sha256"))
    return BaselineFile(test=check.str_(doc.get("test"), "test"),
                        machine_class=check.str_(doc.get("machine_class"), "machine_class"),
                        machine=check.obj(doc.get("machine", {}), "machine"),
                        environment=check.obj(doc.get("environment", {}), "environment"),
                        saved_at=check.str_(doc.get("saved_at", ""), "saved_at"), jobs=jobs)


# -- the store --------------------------------------------------------------------------------------------------
_SAFE = re.compile(r"[^A-Za-z0-9._=-]+")


def file_name_for(nodeid: str) -> str:
    """A readable file name for a test: `perf_tests.test_zero3--test_x.json`, plus a short hash of the node id
    when characters were replaced or the name is long, so names never collide."""
    path, _, rest = nodeid.partition("::")
    path = path[:-3] if path.endswith(".py") else path
    readable = path.replace("/", ".").replace("\\", ".") + ("--" + rest.replace("::", "--") if rest else "")
    safe = _SAFE.sub("_", readable).strip("._") or "test"
    if safe != readable or len(safe) > 150:
        safe = f"{safe[:150]}-{hashlib.sha1(nodeid.encode()).hexdigest()[:8]}"
    return safe + ".json"


@dataclass
class Saved:
    """What Store.save_over did: the file written and what it holds, the usable baseline it replaced (None: there
    was none), and where an unusable file there was moved aside, with why it could not be used."""

    path: str
    written: BaselineFile
    replaced: BaselineFile | None = None
    aside: str | None = None
    unusable: str | None = None


def _move_aside(path: str) -> str:
    """Rename an unusable baseline to `<name>.corrupt-<UTC time>` (call it under the folder's lock)."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    aside, n = f"{path}.corrupt-{stamp}", 1
    while os.path.lexists(aside):
        n += 1
        aside = f"{path}.corrupt-{stamp}-{n}"
    try:
        os.rename(path, aside)
    except OSError as e:
        raise BaselineError(f"{path}: cannot move the unusable file aside: {e.strerror or e}") from None
    return aside


class Store:
    """Baseline files under one root folder, one sub-folder per machine class.

    A test's file is named after its key: the test file's path from the project root and the test's name in it,
    e.g. `perf_tests/test_zero3.py::test_x`. Not the node id: that is relative to the rootdir pytest infers,
    which a path-like option value can move (pytest-dev/pytest#8846), and a moved rootdir would make every test
    read "new" and let a slowdown pass.
    """

    def __init__(self, root: str, project_root: str | None = None):
        self.root = os.path.abspath(root)
        self.project_root = os.path.abspath(project_root) if project_root else os.path.dirname(self.root)

    def key_for(self, test_file: str, nodeid: str) -> str:
        """The key of the test `nodeid` defined in `test_file`."""
        rel = os.path.relpath(os.path.abspath(test_file), self.project_root).replace(os.sep, "/")
        _, sep, name = nodeid.partition("::")
        return f"{rel}::{name}" if sep else rel

    def path_for(self, machine_class: str, key: str) -> str:
        return os.path.join(self.root, machine_class, file_name_for(key))

    def load(self, path: str, key: str) -> BaselineFile | None:
        """The baseline in `path`, None when there is none. Never writes. BaselineReplaceable when its contents
        cannot be used; a symlink or a folder is refused as such."""
        if not os.path.lexists(path):
            return None
        if os.path.islink(path):
            raise BaselineError(f"{path}: is a symlink, not a baseline file; distperf neither reads nor writes "
                                f"through one: replace it with the file itself")
        if not os.path.isfile(path):
            raise BaselineError(f"{path}: expected a baseline file, found something else (a folder?)")
        try:
            baseline = parse(read_json(path), path)
        except (BaselineTooNew, BaselineReplaceable):
            raise
        except BaselineError as e:  # parse's: wrongly typed, non-finite, not a baseline
            raise BaselineReplaceable(str(e)) from None
        if baseline.test != key:
            raise BaselineReplaceable(f"{path}: holds the baseline of test {baseline.test!r}, not {key!r}; the file "
                                      f"was renamed or copied -- move it back or delete it")
        folder = os.path.basename(os.path.dirname(path))
        if baseline.machine_class != folder:  # another machine's numbers would judge this one's
            raise BaselineReplaceable(f"{path}: holds the baseline of machine class {baseline.machine_class!r}, but "
                                      f"sits in the folder of {folder!r}; the file was copied or moved -- move it "
                                      f"to its machine class's folder or delete it")
        return baseline

    def unmatched_note(self, machine_class: str, key: str) -> str | None:
        """A note when this test has no file but its machine-class folder holds what looks like its baseline under
        an old key: a baseline whose test is gone from where it was recorded and that has this test's name (a
        moved file) or file (a renamed test). None otherwise: a brand-new test is simply new."""
        folder = os.path.join(self.root, machine_class)
        own = file_name_for(key)
        try:
            others = sorted(n for n in os.listdir(folder) if n.endswith(".json") and not n.startswith(".") and n != own)
        except OSError:
            return None
        path, _, name = key.partition("::")
        candidates, same_name = [], False
        for n in others:
            try:
                other = read_json(os.path.join(folder, n)).get("test")
            except Exception:  # unreadable or not an object: not a candidate
                continue
            if not isinstance(other, str) or other == key:
                continue
            other_path, _, other_name = other.partition("::")
            named = bool(name) and other_name == name
            if (named or other_path == path) and not self._test_exists(other_path, other_name):
                candidates.append(n)
                same_name = same_name or named
        if not candidates:
            return None
        listed = ", ".join(candidates[:5]) + (f" and {len(candidates) - 5} more" if len(candidates) > 5 else "")
        return (f"no baseline file {own} for this test (key {key!r}), but {folder} holds {len(candidates)} "
                f"other baseline(s) of {'a test with the same name' if same_name else 'a test of this file'} that "
                f"is no longer where it was recorded: {listed}. Was the test renamed or moved, or were the baselines "
                f"saved from another project root? Rename the file (and its \"test\" field) or record it again "
                f"with --distperf-save")

    def _test_exists(self, rel_path: str, name: str) -> bool:
        """Whether the test file (relative to the project root) still defines the test (by its function name)."""
        try:
            with open(os.path.join(self.project_root, rel_path), encoding="utf-8", errors="replace") as f:
                source = f.read()
        except OSError:
            return False
        function = name.rpartition("::")[2].partition("[")[0]
        return not function or re.search(rf"\bdef\s+{re.escape(function)}\s*\(", source) is not None

    def save(self, baseline: BaselineFile) -> str:
        return self.save_over(baseline).path

    def save_over(self, baseline: BaselineFile) -> Saved:
        """Write `baseline` as its test's file and say what it replaced. The file there is read and replaced under
        the folder's lock, so what is reported replaced is what the write replaced (another writer's, if one came
        in between). An unusable file is moved aside to `<name>.corrupt-<UTC time>` (never deleted); a newer
        format's, a symlink or a folder is left as it is (BaselineError)."""
        path = self.path_for(baseline.machine_class, baseline.test)
        replaced, aside, unusable = None, None, None
        try:
            with jsonio.folder_lock(path):
                try:
                    replaced = self.load(path, baseline.test)
                except BaselineReplaceable as e:
                    aside, unusable = _move_aside(path), str(e)
                jsonio.write_json_atomic(path, baseline.to_dict(), lock=False)
        except FileError as e:
            raise BaselineError(str(e)) from None
        return Saved(path, baseline, replaced, aside, unusable)

    def check_writable(self, machine_classes: Iterable[str] = ()) -> None:
        """BaselineError, before any job runs, when --distperf-save could not write the baselines folder or these
        machine classes' folders, saying what is in the way. Creates nothing."""
        from pytest_distperf.store.outputs import OutputPathError, check_folder

        try:
            check_folder(self.root, "--distperf-save: baselines folder")
            for name in sorted(set(machine_classes)):
                check_folder(os.path.join(self.root, name), f"--distperf-save: baselines of machine class {name}")
        except OutputPathError as e:
            raise BaselineError(str(e)) from None
