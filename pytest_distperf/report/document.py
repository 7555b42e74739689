"""The session document: one typed record of each distperf test, built once, that every report reads.

A test's records (jobs, checks, baseline verdicts, probes, saved baselines, and the context its verdicts were
decided in) cross the xdist boundary as their JSON and are typed again once, by `TestDocument.from_records`.
`SessionDocument.to_json` is the JSON report and `SessionDocument.from_json` reads one back. No report derives
a figure.
"""

from __future__ import annotations

import datetime as _dt
from collections import Counter
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
    """One job of a test as the test ended: its figures, the identity the baseline keys it by, its runs (each
    serialised once, store/report_format.run_to_dict) and what the fixture adds."""

    figures: JobFigures
    config_hash: str  # as the baseline keys the job: its injection knobs left out
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
    if kind == "check":
        return (ProbeCheck if "direction" in d else Check).from_json(d)
    types = {"job": JobRecord, "baseline": MetricVerdict, "probe": ProbeSummary, "baseline_saved": DetectableChange}
    if kind not in types:
        raise ValueError(f"distperf record: kind must be job, check, baseline, probe or baseline_saved, got {kind!r}")
    return types[kind].from_json(d)


# Where TestDocument.add files each record type.
_LISTS = ((JobRecord, "jobs"), (Check, "checks"), (MetricVerdict, "verdicts"), (ProbeSummary, "probes"),
          (DetectableChange, "saved"))


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
    out_of_budget: str | None = None  # why --distperf-session-budget stopped it before its first look; None: not

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
        """A test of a JSON report typed again; ValueError/KeyError/TypeError where it is not one."""
        kinds = {"checks": "check", "verdicts": "baseline", "probes": "probe", "baseline_saved": "baseline_saved"}
        diffs = t.get("explanations") or {}  # a job's what-changed diff, once: each verdict it explains gets it
        lists = {**t, "verdicts": [{**v, "explanation": diffs.get(v.get("job"))} if v.get("explained") else v
                                   for v in t.get("verdicts") or []]}
        records: list[Record | Mapping[str, Any]] = [{**r, "kind": kind} for name, kind in kinds.items()
                                                     for r in lists.get(name) or []]
        records += [JobRecord.from_json(j) for j in t.get("jobs") or []]
        return cls.from_records(str(t["nodeid"]), str(t["outcome"]), float(t.get("duration") or 0.0), records,
                                GateContext.from_json(dict(t)), t.get("message"), t.get("failure"),
                                t.get("xfail_reason"), t.get("out_of_budget"))

    def add(self, record: Record) -> None:
        name = next((name for kind, name in _LISTS if isinstance(record, kind)), None)
        if name is None:
            raise TypeError(f"distperf record: {type(record).__name__} is not a record")
        getattr(self, name).append(record)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"nodeid": self.nodeid, "outcome": self.outcome, "duration": self.duration,
                             "message": self.message}
        if self.context is not None:
            d.update(self.context.to_json())
        d.update((k, v) for k, v in (("failure", self.failure), ("xfail_reason", self.xfail_reason)) if v is not None)
        d["out_of_budget"] = self.out_of_budget  # every test says whether the session budget stopped it
        verdicts, explanations = [v.to_json() for v in self.verdicts], {}
        for v in verdicts:  # every verdict of a job carries the same diff: written once, in `explanations`
            diff = v.pop("explanation", None)
            v["explained"] = diff is not None
            if diff is not None:
                explanations.setdefault(v["job"], diff)
        d.update({"jobs": [j.to_json() for j in self.jobs],
                  "checks": [c.to_json() for c in self.checks], "verdicts": verdicts, "explanations": explanations,
                  "probes": [p.to_json() for p in self.probes], "baseline_saved": [s.to_json() for s in self.saved]})
        return d


@dataclass
class SharedJob:
    """A job once, however many tests carry it: the view with the most runs, and the test that saw them."""

    job: JobRecord
    test: TestDocument
    tests: list[str]  # every test that carries the job, in the order they ended


def unique_jobs(tests: Iterable[TestDocument]) -> list[SharedJob]:
    """Each job once, by its id, in the order the jobs first appeared; of the views tests that share its runs
    carry, the one with the most runs."""
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
        """A JSON report typed again (an older one brought up to date, a newer one refused naming `source`);
        KeyError, TypeError or ValueError where it is not a report."""
        doc = REPORT.load(doc, source)
        return cls([TestDocument.from_json(t) for t in doc["tests"]], dict(doc.get("environment") or {}),
                   dict(doc.get("invocation") or {}), str(doc.get("created_at") or ""))

    def to_json(self) -> dict[str, Any]:
        outcomes = dict(Counter(t.outcome for t in self.tests))
        verdicts = dict(Counter(v.status for t in self.tests for v in t.verdicts))
        return REPORT.stamp({
            "created_at": self.created_at,
            "environment": self.environment,
            "invocation": self.invocation,
            "summary": {"tests": len(self.tests), "outcomes": outcomes, "verdicts": verdicts,
                        "out_of_budget": sum(1 for t in self.tests if t.out_of_budget)},
            # what each job figure is: unit and scope (per rank, slowest rank, summed)
            "figures": {name: {"unit": unit, "scope": scope} for name, (unit, scope) in SCOPES.items()},
            "tests": [t.to_json() for t in self.tests],
        })
