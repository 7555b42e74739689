"""The session document: one typed record of each distperf test, built once when its report reaches the
controller, that every report reads.

A test's records are made in the ranks' parent (fixture.py, decide/): each job as the test ended (`JobRecord`:
its figures and runs), its checks (`decide.checks.Check`), its baseline verdicts (`decide.verdicts.MetricVerdict`),
its probes (`rank.probes.results.ProbeSummary`), what a saved baseline lets the gate decide
(`decide.verdicts.DetectableChange`) and the context its verdicts were decided in (`decide.regression.GateContext`).
They cross the xdist boundary as their JSON (`to_json`, the report attributes `distperf_records` and
`distperf_context`), and `TestDocument.from_records` makes them typed again, once. The JSON report is
`SessionDocument.to_json` (each job once, `tests[].jobs[]`); `SessionDocument.from_json` reads one back (the HTML
report and the PR comment draw from it). No report derives a figure.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Union

from pytest_distperf.decide.checks import Check
from pytest_distperf.decide.probe_checks import ProbeCheck
from pytest_distperf.decide.verdicts import MetricVerdict, DetectableChange
from pytest_distperf.decide.regression import GateContext
from pytest_distperf.figures.quantities import SCOPES, JobFigures, job_figures
from pytest_distperf.rank.probes.results import ProbeSummary
from pytest_distperf.store.baselines import job_identity
from pytest_distperf.store.report_format import REPORT, run_to_dict

if TYPE_CHECKING:
    from pytest_distperf.rank.results import RunResult


@dataclass
class JobRecord:
    """One job of a test as the test ended: its figures (figures/quantities.job_figures, the one derivation), the
    identity the baseline keys it by, its runs (store/report_format.run_to_dict, each run's one serialisation),
    and what the fixture adds. The JSON report holds it once, as `tests[].jobs[]`."""

    figures: JobFigures
    config_hash: str  # as the baseline keys the job: its injection knobs left out (store/baselines.job_identity)
    config: dict[str, Any] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)  # each run's figures and per-rank measurements
    slot_wait_seconds: tuple[float, ...] = ()  # per run: the wait for its measurement slot (off the budgets)
    departures: dict[str, str] = field(default_factory=dict)  # where the adapter departs from its library's defaults

    @property
    def id(self) -> str:
        return self.figures.id

    @property
    def label(self) -> str:
        return self.figures.label

    @classmethod
    def from_runs(cls, label: str, runs: list["RunResult"], departures: Mapping[str, str] | None = None
                  ) -> "JobRecord":
        _, config_hash, config, _ = job_identity(runs[0].spec)
        return cls(job_figures(label, runs), config_hash, config, [run_to_dict(r) for r in runs],
                   tuple(round(getattr(r, "slot_wait_seconds", 0.0), 3) for r in runs), dict(departures or {}))

    def to_json(self) -> dict[str, Any]:
        return {"kind": "job", "id": self.id, "label": self.label, "config_hash": self.config_hash,
                "config": self.config, "figures": self.figures.to_json(), "runs": self.runs,
                "slot_wait_seconds": list(self.slot_wait_seconds), "departures": dict(self.departures)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "JobRecord":
        """A job of a JSON report; KeyError, TypeError or ValueError where it is not one."""
        figures = JobFigures.from_json({**d["figures"], "label": d["label"], "id": d.get("id") or ""})
        return cls(figures, str(d.get("config_hash") or figures.config_hash), dict(d.get("config") or {}),
                   [dict(r) for r in d.get("runs") or []], tuple(float(x) for x in d.get("slot_wait_seconds") or ()),
                   {str(k): str(v) for k, v in (d.get("departures") or {}).items()})


Record = Union[JobRecord, Check, MetricVerdict, ProbeSummary, DetectableChange]


def record_from_json(d: Mapping[str, Any]) -> Record:
    """A record from its JSON (its `kind`); ValueError naming the kind when it is not one."""
    kind = d.get("kind")
    if kind == "job":
        return JobRecord.from_json(d)
    if kind == "check":
        return (ProbeCheck if "direction" in d else Check).from_json(d)
    if kind == "baseline":
        return MetricVerdict.from_json(d)
    if kind == "probe":
        return ProbeSummary.from_json(d)
    if kind == "baseline_saved":
        return DetectableChange.from_json(d)
    raise ValueError(f"distperf record: kind must be job, check, baseline, probe or baseline_saved, got {kind!r}")


@dataclass
class TestDocument:
    """One distperf test: its outcome and every record its report carried, typed."""

    nodeid: str
    outcome: str  # passed | failed | skipped | error
    duration: float
    jobs: list[JobRecord] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    verdicts: list[MetricVerdict] = field(default_factory=list)
    probes: list[ProbeSummary] = field(default_factory=list)
    saved: list[DetectableChange] = field(default_factory=list)
    context: GateContext | None = None  # the machine class, the baseline or base checkout; None: none read
    message: str | None = None  # the failure text
    failure: str | None = None  # the failure's reason, one line (session.failure_text)
    xfail_reason: str | None = None  # an expected failure's reason (pytest's wasxfail)
    # why --distperf-session-budget stopped the test before its first look was done (SessionBudgetSpent's words:
    # skipped, failed with --distperf-strict); None: it was not
    out_of_budget: str | None = None

    __test__ = False  # not a pytest test class

    @property
    def machine_class(self) -> str | None:
        return self.context.machine_class if self.context else None

    @classmethod
    def from_records(cls, nodeid: str, outcome: str, duration: float, records: Iterable[Record | Mapping[str, Any]],
                     context: GateContext | None = None, message: str | None = None, failure: str | None = None,
                     xfail_reason: str | None = None, out_of_budget: str | None = None) -> "TestDocument":
        doc = cls(nodeid, outcome, duration, context=context, message=message, failure=failure,
                  xfail_reason=xfail_reason, out_of_budget=out_of_budget)
        for r in records:
            doc.add(r if not isinstance(r, Mapping) else record_from_json(r))
        return doc

    @classmethod
    def from_json(cls, t: Mapping[str, Any]) -> "TestDocument":
        """A test of a JSON report (SessionDocument.to_json) typed again; ValueError/KeyError/TypeError where it
        is not one."""
        kinds = {"checks": "check", "verdicts": "baseline", "probes": "probe", "baseline_saved": "baseline_saved"}
        records: list[Record | Mapping[str, Any]] = [{**r, "kind": kind} for name, kind in kinds.items()
                                                     for r in t.get(name) or []]
        records += [JobRecord.from_json(j) for j in t.get("jobs") or []]
        return cls.from_records(str(t["nodeid"]), str(t["outcome"]), float(t.get("duration") or 0.0), records,
                                GateContext.from_json(dict(t)), t.get("message"), t.get("failure"),
                                t.get("xfail_reason"), t.get("out_of_budget"))

    def add(self, record: Record) -> None:
        if isinstance(record, JobRecord):
            self.jobs.append(record)
        elif isinstance(record, Check):
            self.checks.append(record)
        elif isinstance(record, MetricVerdict):
            self.verdicts.append(record)
        elif isinstance(record, ProbeSummary):
            self.probes.append(record)
        elif isinstance(record, DetectableChange):
            self.saved.append(record)
        else:
            raise TypeError(f"distperf record: {type(record).__name__} is not a record")

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"nodeid": self.nodeid, "outcome": self.outcome, "duration": self.duration,
                             "message": self.message}
        if self.context is not None:
            d.update(self.context.to_json())
        if self.failure is not None:
            d["failure"] = self.failure
        if self.xfail_reason is not None:
            d["xfail_reason"] = self.xfail_reason
        d["out_of_budget"] = self.out_of_budget  # every test says whether the session budget stopped it
        d.update({"jobs": [j.to_json() for j in self.jobs],
                  "checks": [c.to_json() for c in self.checks], "verdicts": [v.to_json() for v in self.verdicts],
                  "probes": [p.to_json() for p in self.probes], "baseline_saved": [s.to_json() for s in self.saved]})
        return d


@dataclass
class SharedJob:
    """A job once, however many tests carry it: the view with the most runs, and the test that saw them (its
    verdicts are on those runs)."""

    job: JobRecord
    test: TestDocument
    tests: list[str]  # every test that carries the job, in the order they ended


def unique_jobs(tests: Iterable[TestDocument]) -> list[SharedJob]:
    """Each job once, by its id (figures/quantities.job_id), in the order the jobs first appeared. Tests that share
    a job's runs carry it as it stood when each ended; the view with the most runs is kept."""
    shared: list[SharedJob] = []
    by_id: dict[str, SharedJob] = {}
    for t in tests:
        for job in t.jobs:
            found = by_id.get(job.id) if job.id else None
            if found is None:
                found = SharedJob(job, t, [])
                shared.append(found)
                if job.id:
                    by_id[job.id] = found
            elif job.figures.runs > found.job.figures.runs:
                found.job, found.test = job, t
            if t.nodeid not in found.tests:
                found.tests.append(t.nodeid)
    return shared


@dataclass
class SessionDocument:
    """The session's tests, with the environment and invocation they ran under; its JSON is the JSON report."""

    tests: list[TestDocument]
    environment: dict[str, Any]
    invocation: dict[str, Any]
    created_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat())

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], source: str = "JSON report") -> "SessionDocument":
        """A JSON report typed again (REPORT.load: an older one brought up to date, a newer one refused with
        FormatVersionError naming `source`); KeyError, TypeError or ValueError where it is not a report."""
        doc = REPORT.load(doc, source)
        return cls([TestDocument.from_json(t) for t in doc["tests"]], dict(doc.get("environment") or {}),
                   dict(doc.get("invocation") or {}), str(doc.get("created_at") or ""))

    def to_json(self) -> dict[str, Any]:
        verdicts: dict[str, int] = {}
        outcomes: dict[str, int] = {}
        for t in self.tests:
            outcomes[t.outcome] = outcomes.get(t.outcome, 0) + 1
            for v in t.verdicts:
                verdicts[v.status] = verdicts.get(v.status, 0) + 1
        return REPORT.stamp({
            "created_at": self.created_at,
            "environment": self.environment,
            "invocation": self.invocation,
            "summary": {"tests": len(self.tests), "outcomes": outcomes, "verdicts": verdicts,
                        "out_of_budget": sum(1 for t in self.tests if t.out_of_budget)},
            # what each job figure is: unit and scope (per rank, slowest rank, summed), as figures/quantities defines it
            "figures": {name: {"unit": unit, "scope": scope} for name, (unit, scope) in SCOPES.items()},
            "tests": [t.to_json() for t in self.tests],
        })
