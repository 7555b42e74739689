"""The session document: one typed record of each distperf test, built once when its report reaches the
controller, that every report reads.

A test's records are made in the ranks' parent (fixture.py, decide/): a job's figures (`JobRecord`), its checks
(`decide.checks.Check`), its baseline verdicts (`decide.verdicts.MetricVerdict`), its probes
(`rank.probes.results.ProbeSummary`) and what a saved baseline lets the gate decide (`decide.verdicts.Resolution`).
They cross the xdist boundary as their JSON (`to_json`, the report attribute `distperf_records`), and
`TestDocument.from_records` makes them typed again, once. The terminal table, the Markdown summary, the
pytest-benchmark export and the undecided list read a TestDocument; the JSON report is `SessionDocument.to_json`,
and the HTML report, the PR comment and the history read that serialisation (a report can be drawn again from
its file). None of them derives a figure.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Union

from pytest_distperf.decide.checks import Check
from pytest_distperf.decide.probe_checks import ProbeCheck
from pytest_distperf.decide.verdicts import MetricVerdict, Resolution
from pytest_distperf.measure.figures import SCOPES, JobFigures
from pytest_distperf.rank.probes.results import ProbeSummary
from pytest_distperf.store.report_format import REPORT_VERSION


@dataclass
class JobRecord:
    """A job's figures as its test ended (measure/figures.JobFigures), with what the fixture adds."""

    figures: JobFigures
    slot_wait_seconds: tuple[float, ...] = ()  # per run: the wait for its measurement slot (off the budgets)
    departures: dict[str, str] = field(default_factory=dict)  # where the adapter departs from its library's defaults

    def to_json(self) -> dict[str, Any]:
        d = {"kind": "run", **self.figures.to_json(), "slot_wait_seconds": list(self.slot_wait_seconds)}
        if self.departures:
            d["departures"] = dict(self.departures)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "JobRecord":
        return cls(JobFigures.from_json(dict(d)), tuple(float(x) for x in d.get("slot_wait_seconds") or ()),
                   {str(k): str(v) for k, v in (d.get("departures") or {}).items()})


Record = Union[JobRecord, Check, MetricVerdict, ProbeSummary, Resolution]


def record_from_json(d: Mapping[str, Any]) -> Record:
    """A record from its JSON (its `kind`); ValueError naming the kind when it is not one."""
    kind = d.get("kind")
    if kind == "run":
        return JobRecord.from_json(d)
    if kind == "check":
        return (ProbeCheck if "direction" in d else Check).from_json(d)
    if kind == "baseline":
        return MetricVerdict.from_json(d)
    if kind == "probe":
        return ProbeSummary.from_json(d)
    if kind == "baseline_saved":
        return Resolution.from_json(d)
    raise ValueError(f"distperf record: kind must be run, check, baseline, probe or baseline_saved, got {kind!r}")


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
    saved: list[Resolution] = field(default_factory=list)
    # machine class, environment, the jobs with their runs (store/document.job_to_dict), failure, xfail_reason
    detail: dict[str, Any] = field(default_factory=dict)
    message: str | None = None  # the failure text

    __test__ = False  # not a pytest test class

    @classmethod
    def from_records(cls, nodeid: str, outcome: str, duration: float, records: Iterable[Record | Mapping[str, Any]],
                     detail: Mapping[str, Any] | None = None, message: str | None = None) -> "TestDocument":
        doc = cls(nodeid, outcome, duration, detail=dict(detail or {}), message=message)
        for r in records:
            doc.add(r if not isinstance(r, Mapping) else record_from_json(r))
        return doc

    @classmethod
    def from_json(cls, t: Mapping[str, Any]) -> "TestDocument":
        """A test of a JSON report (SessionDocument.to_json) typed again; ValueError/KeyError where it is not one."""
        kinds = {"runs": "run", "checks": "check", "verdicts": "baseline", "probes": "probe",
                 "baseline_saved": "baseline_saved"}
        own = ("nodeid", "outcome", "duration", "message", *kinds)
        records = [{**r, "kind": kind} for name, kind in kinds.items() for r in t.get(name) or []]
        return cls.from_records(str(t["nodeid"]), str(t["outcome"]), float(t.get("duration") or 0.0), records,
                                {k: v for k, v in t.items() if k not in own}, t.get("message"))

    def add(self, record: Record) -> None:
        if isinstance(record, JobRecord):
            self.jobs.append(record)
        elif isinstance(record, Check):
            self.checks.append(record)
        elif isinstance(record, MetricVerdict):
            self.verdicts.append(record)
        elif isinstance(record, ProbeSummary):
            self.probes.append(record)
        elif isinstance(record, Resolution):
            self.saved.append(record)
        else:
            raise TypeError(f"distperf record: {type(record).__name__} is not a record")

    def to_json(self) -> dict[str, Any]:
        return {"nodeid": self.nodeid, "outcome": self.outcome, "duration": self.duration, "message": self.message,
                **self.detail,
                "runs": [j.to_json() for j in self.jobs], "checks": [c.to_json() for c in self.checks],
                "verdicts": [v.to_json() for v in self.verdicts], "probes": [p.to_json() for p in self.probes],
                "baseline_saved": [s.to_json() for s in self.saved]}


@dataclass
class SessionDocument:
    """The session's tests, with the environment and invocation they ran under; its JSON is the JSON report."""

    tests: list[TestDocument]
    environment: dict[str, Any]
    invocation: dict[str, Any]
    created_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat())

    def to_json(self) -> dict[str, Any]:
        verdicts: dict[str, int] = {}
        outcomes: dict[str, int] = {}
        for t in self.tests:
            outcomes[t.outcome] = outcomes.get(t.outcome, 0) + 1
            for v in t.verdicts:
                verdicts[v.status] = verdicts.get(v.status, 0) + 1
        return {
            "report_version": REPORT_VERSION,
            "created_at": self.created_at,
            "environment": self.environment,
            "invocation": self.invocation,
            "summary": {"tests": len(self.tests), "outcomes": outcomes, "verdicts": verdicts},
            # what each job figure is: unit and scope (per rank, slowest rank, summed), as measure/figures defines it
            "figures": {name: {"unit": unit, "scope": scope} for name, (unit, scope) in SCOPES.items()},
            "tests": [t.to_json() for t in self.tests],
        }
