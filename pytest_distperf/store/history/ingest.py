"""A session's `--distperf-json` report document -> the rows the history stores: one value per run and gated
metric of every job a test measured, from the figures each run carries."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pytest_distperf.store.history.errors import ReportDocumentError


@dataclass(frozen=True)
class SessionRecord:
    """One pytest session as the history keeps it."""

    created_at: _dt.datetime  # when the session wrote its report (aware, UTC)
    git_commit: str | None
    host: str | None
    environment: dict[str, Any]  # the report's environment (versions, host, cpu, commit)
    report_digest: str  # SHA-256 of the canonical JSON of the whole document


@dataclass(frozen=True)
class Measurement:
    """One run-level value of one metric of one job in one test."""

    machine_class: str
    test: str
    job: str
    config_hash: str | None
    metric: str
    unit: str
    direction: str  # "lower" or "higher" is better
    kind: str  # time | memory | count
    run_index: int
    value: float
    host_load: float | None = None  # other load on the host's cores during the run (host_other_load_cores)


def read_report(doc: Any, source: str = "report document") -> tuple[SessionRecord, list[Measurement]]:
    """Validate a `json_report` document and flatten it; `source` names it in errors (a file, an option)."""
    from pytest_distperf.errors import FileError
    from pytest_distperf.store.report_format import REPORT

    try:
        doc = REPORT.load(doc, source)
    except FileError as e:  # not an object, no format_version, or a newer one
        raise ReportDocumentError(str(e)) from None
    for key, kind, what in (("created_at", str, "a string"), ("environment", dict, "an object"),
                            ("tests", list, "an array")):
        if not isinstance(doc.get(key), kind):
            raise ReportDocumentError(f"{source}: '{key}' is missing or not {what} (is this a --distperf-json "
                                      f"report?)")
    environment = doc["environment"]
    session = SessionRecord(created_at=_timestamp(doc["created_at"], f"{source}: 'created_at'"),
                            git_commit=_opt_str(environment.get("git_commit")),
                            host=_opt_str(environment.get("host")), environment=environment,
                            report_digest=hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":"),
                                                                    default=repr).encode()).hexdigest())
    return session, [row for i, test in enumerate(doc["tests"]) for row in _test_rows(test, f"{source}: tests[{i}]")]


def _test_rows(test: Any, where: str) -> list[Measurement]:
    if not isinstance(test, dict) or not isinstance(test.get("nodeid"), str):
        raise ReportDocumentError(f"{where}: a test entry needs a 'nodeid' string")
    where = f"{where} ({test['nodeid']})"
    jobs = test.get("jobs") or []
    if not jobs:
        return []
    machine_class = test.get("machine_class")
    if not isinstance(machine_class, str) or not machine_class:
        raise ReportDocumentError(f"{where}: has jobs but no 'machine_class'")
    if not isinstance(jobs, list):
        raise ReportDocumentError(f"{where}: 'jobs' is not an array")
    from pytest_distperf.figures.quantities import RunFigures, metric_traits, metric_values

    rows = []
    for j, job in enumerate(jobs):
        job_where = f"{where}: jobs[{j}]"
        if not isinstance(job, dict) or not isinstance(job.get("label"), str):
            raise ReportDocumentError(f"{job_where}: a job needs a 'label' string")
        runs = job.get("runs")
        if not isinstance(runs, list):
            raise ReportDocumentError(f"{job_where} ({job['label']}): 'runs' is missing or not an array")
        figures = []
        for r, run in enumerate(runs):
            run_where = f"{job_where} ({job['label']}): runs[{r}]"
            if not isinstance(run, dict):
                raise ReportDocumentError(f"{run_where}: a run must be an object, got {type(run).__name__}")
            try:
                figures.append(RunFigures.from_json(run["figures"]))
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise ReportDocumentError(f"{run_where}: its figures must be an object of numbers "
                                          f"({type(e).__name__}: {e})") from None
        loads = [_opt_float(run.get("host_other_load_cores")) for run in runs]
        for metric, values in (metric_values(figures) if figures else {}).items():
            unit, direction, kind = metric_traits(metric)
            rows += [Measurement(machine_class=machine_class, test=test["nodeid"], job=job["label"],
                                 config_hash=_opt_str(job.get("config_hash")), metric=metric, unit=unit,
                                 direction=direction, kind=kind, run_index=r, value=v, host_load=loads[r])
                     for r, v in enumerate(values)]
    return rows


def _timestamp(text: str, where: str) -> _dt.datetime:
    try:
        value = _dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ReportDocumentError(f"{where}: {text!r} is not an ISO 8601 time") from None
    if value.tzinfo is None:
        raise ReportDocumentError(f"{where}: {text!r} has no UTC offset")
    return value.astimezone(_dt.timezone.utc)


def _opt_float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _opt_str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
