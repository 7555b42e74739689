"""The verdicts of a JSON report document as rows, and its jobs and probe records each once.

The HTML report (report/views.py) and the PR comment (report/pr_comment.py) both read these, so a verdict
reads the same in both: one row per check, per baseline verdict, and per test that failed without one; tests
that share a comparison's runs carry the same verdict, which is one shared row naming every test.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pytest_distperf.measure.units import fmt_value
from pytest_distperf.report.outcomes import LIMIT_SIGN, check_outcome, test_outcome, verdict_outcome
from pytest_distperf.measure.wording import WIDE, is_words, pair_to_pair


def fmt_unit(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "rel":
        return f"{value:.1e}"
    return fmt_value(value, unit)


def has_interval(record: Mapping[str, Any]) -> bool:
    """An interval was computed (an end may be None: unbounded); exact checks and counts have none."""
    if record.get("method") == "exact" or record.get("metric_kind") == "count":
        return False
    return record.get("low") is not None or record.get("high") is not None or record.get("level") is not None


def interval_cell(record: Mapping[str, Any]) -> str:
    """The record's interval as the gate wrote it (`interval_text`: numbers, or words where the design cannot
    bound it), with its level: '[0.73, 1.63] (98%)'; '–' without one."""
    if not has_interval(record):
        return "–"
    text = str(record["interval_text"])
    level = record.get("level")
    return text if is_words(text) or not level else f"{text} ({level:.0%})"


def level_text(record: Mapping[str, Any]) -> str:
    level = record.get("level")
    return f"{level:.0%} interval" if level else "interval"


def chart_ends(record: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """The interval's ends for a chart; an end beyond WIDE times (or below 1/WIDE of) the estimate is drawn
    as unbounded, off the axis, so an end of 1e6 does not squash the axis."""
    low, high = record.get("low"), record.get("high")
    if not has_interval(record) or not is_words(str(record["interval_text"])):
        return low, high
    delta = record.get("kind") == "baseline"  # a baseline verdict's ends are changes
    value = float(record.get("delta") or 0.0) + 1.0 if delta else float(record.get("ratio") or 0.0)
    shift = 1.0 if delta else 0.0
    low = None if low is None or not value > 0 or low + shift < value / WIDE or low + shift <= 0 else low
    high = None if high is None or not value > 0 or high + shift > value * WIDE else high
    return low, high


@dataclass
class VerdictRow:
    test: str
    kind: str  # "ratio", "probe", "baseline", "test"
    subject: str
    value: str
    interval: str
    limit: str
    outcome: str
    note: str = ""
    fails: bool = False  # the document says this verdict fails the test although its outcome is not 'fail'


def check_row(test: Mapping[str, Any], c: Mapping[str, Any]) -> VerdictRow:
    xfailed = test_outcome(test) == "xfail"
    outcome = check_outcome(c, xfailed)
    note = "a declared known gap (strict xfail)" if outcome == "xfail" else ""
    unit = c.get("unit", "")
    probe = "direction" in c  # a probe check (gate/probe_checks.ProbeCheck); a ratio check is always "at most"
    absolute = probe and c["b"] == "limit"
    sign = LIMIT_SIGN[c["direction"] if probe else "at_most"]
    if unit == "rel":
        value, limit = f"{c['ratio']:.1e}", f"≤ {c['threshold']:.0e}"
    elif absolute:
        value, limit = fmt_unit(c["ratio"], unit), f"{sign} {fmt_unit(c['threshold'], unit)}"
    else:
        value, limit = f"{c['ratio']:.3f}×", f"{sign} {c['threshold']:g}×"
    if c.get("method") == "paired":  # the noise the interval is made of, shown next to it
        noise = f"{c.get('pairs')} pairs, pair-to-pair {pair_to_pair(c.get('method'), c.get('pair_cv'))}"
        note = f"{note}; {noise}" if note else noise
    subject = f"{c.get('name')}: {c.get('a')}" + ("" if absolute else f" vs {c.get('b')}")
    return VerdictRow(test["nodeid"], "probe" if probe else "ratio", subject, value, interval_cell(c), limit,
                      outcome, note)


def verdict_row(test: Mapping[str, Any], v: Mapping[str, Any]) -> VerdictRow:
    outcome = verdict_outcome(v, test_outcome(test) == "xfail")
    fails = bool(v.get("fails")) and outcome != "fail"  # e.g. 'new' under --distperf-require-baseline
    limit = f"± {v['threshold']:.1%}" if v.get("threshold") is not None else "–"
    delta = "–" if v.get("delta") is None else f"{v['delta']:+.1%}"
    arrow = " base → head " if v.get("reference") else " → "  # head vs base (decide/against.py): both commits
    value = f"{delta} ({fmt_unit(v.get('baseline'), v.get('unit', ''))}{arrow}{fmt_unit(v.get('current'), v.get('unit', ''))})"
    subject = f"{v.get('metric')} of {v.get('job')}" + (f", {v['reference']}" if v.get("reference") else "")
    return VerdictRow(test["nodeid"], "baseline", subject, value, interval_cell(v), limit, outcome,
                      v.get("note") or "", fails)


def verdict_rows(doc: Mapping[str, Any]) -> list[VerdictRow]:
    """Every check and baseline verdict of every test, plus a row for a test that failed without one."""
    rows: list[VerdictRow] = []
    for t in doc["tests"]:
        own = [check_row(t, c) for c in t["checks"]] + [verdict_row(t, v) for v in t["verdicts"]]
        outcome = test_outcome(t)
        if not own or outcome in ("fail", "error") and not any(r.outcome == "fail" for r in own):
            message = (t.get("message") or "").strip().splitlines()
            failure = " ".join((t.get("failure") or "").split())  # the exception's message (session.failure_text)
            own.append(VerdictRow(t["nodeid"], "test", "test outcome", "–", "–", "–", outcome,
                                  failure[:300] if failure else (message[-1][:200] if message else "")))
        rows += own
    return rows


@dataclass
class SharedRow:
    row: VerdictRow
    tests: list[str]  # every test that carries this row (tests sharing a comparison's runs carry the same)


def shared_rows(rows: Iterable[VerdictRow]) -> list[SharedRow]:
    out: dict[tuple[Any, ...], SharedRow] = {}
    for r in rows:
        key = (r.kind, r.subject, r.value, r.interval, r.limit, r.outcome, r.note, r.fails)
        if key in out:
            out[key].tests.append(r.test)
        else:
            out[key] = SharedRow(r, [r.test])
    return list(out.values())


def run_steps(run: Mapping[str, Any]) -> list[float]:
    return [float(t) for t in run["step_times"]]


def _job_key(job: Mapping[str, Any]) -> tuple[Any, ...]:
    """A job's identity across tests: tests that share a comparison's runs carry the same job."""
    return (job.get("label"), job.get("config_hash"), tuple(tuple(run_steps(r)) for r in job["runs"]))


@dataclass
class JobView:
    job: dict[str, Any]
    tests: list[str]  # node ids that carry these runs


def unique_jobs(doc: Mapping[str, Any]) -> list[JobView]:
    """Each job's runs once. Tests that share a comparison carry its runs as they were when each test ended; a job
    is named by its first run's id (measure/figures.job_id), so a comparison that grew later is one job, shown with all
    its runs. A version-1 report has no ids: there a job whose runs begin another's is that job."""
    order: list[str] = []
    views: dict[Any, JobView] = {}
    for t in doc["tests"]:
        for job in t.get("jobs") or []:  # a test that ended before its first job has none
            key = job.get("id") or _job_key(job)
            view = views.get(key)
            if view is None:
                views[key] = JobView(job, [t["nodeid"]])
                order.append(key)
                continue
            view.tests.append(t["nodeid"])
            if len(job["runs"]) > len(view.job["runs"]):
                view.job = job
    unique = [views[k] for k in order]
    if all(v.job.get("id") for v in unique):
        return unique
    return _merge_by_value(unique)


def _merge_by_value(views: list[JobView]) -> list[JobView]:
    first_seen = {id(v): i for i, v in enumerate(views)}
    kept: list[tuple[int, JobView]] = []  # (where it first appeared, the view with the most runs)
    for view in sorted(views, key=lambda v: -len(v.job["runs"])):
        label, config_hash, runs = _job_key(view.job)
        at = next((i for i, (_, k) in enumerate(kept) if _job_key(k.job)[:2] == (label, config_hash)
                   and _job_key(k.job)[2][:len(runs)] == runs), None)
        if at is None:
            kept.append((first_seen[id(view)], view))
        else:
            first, longer = kept[at]
            longer.tests = [n for n in view.tests if n not in longer.tests] + longer.tests
            kept[at] = (min(first, first_seen[id(view)]), longer)
    return [view for _, view in sorted(kept, key=lambda item: item[0])]


def probe_records(doc: Mapping[str, Any]) -> list[tuple[dict[str, Any], list[str]]]:
    """Probe records, each once (tests that share a probed job carry the same record)."""
    seen: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for t in doc["tests"]:
        for p in t["probes"]:
            key = json.dumps([p.get("label"), p.get("traces"), p.get("metrics")], sort_keys=True, default=str)
            if key in seen:
                seen[key][1].append(t["nodeid"])
            else:
                seen[key] = (p, [t["nodeid"]])
    return list(seen.values())
