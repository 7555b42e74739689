"""The verdicts of a session document as rows, and its probe records each once: the HTML report and the PR
comment both read these, so a verdict reads the same in both; tests that share a comparison's runs get one
shared row naming every test."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Iterable, Mapping, TypeVar, Union

from pytest_distperf.decide.checks import Check
from pytest_distperf.decide.probe_checks import ProbeCheck
from pytest_distperf.decide.verdicts import MetricVerdict
from pytest_distperf.figures.units import fmt_value
from pytest_distperf.figures.wording import WIDE, is_words, pair_to_pair
from pytest_distperf.rank.probes.results import ProbeSummary
from pytest_distperf.report.document import TestDocument
from pytest_distperf.report.outcomes import LIMIT_SIGN, record_outcome, test_outcome

Decided = Union[Check, MetricVerdict]  # a record with an interval
T = TypeVar("T")


def md_cell(text: object) -> str:
    """A Markdown table cell's text: `|` escaped, one line."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def fmt_unit(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "rel":
        return f"{value:.1e}"
    return fmt_value(value, unit)


def has_interval(record: Decided) -> bool:
    """An interval was computed (an end may be None: unbounded); exact checks and counts have none."""
    if isinstance(record, Check) and record.method == "exact":
        return False
    if isinstance(record, MetricVerdict) and record.metric_kind == "count":
        return False
    return record.low is not None or record.high is not None or record.level is not None


def interval_cell(record: Decided) -> str:
    """The record's interval as every report words it, with its level: '[0.73, 1.63] (98%)'; '–' without one."""
    if not has_interval(record):
        return "–"
    text = record.interval_text()
    return text if is_words(text) or not record.level else f"{text} ({record.level:.0%})"


def level_text(record: Decided) -> str:
    return f"{record.level:.0%} interval" if record.level else "interval"


def chart_ends(record: Decided) -> tuple[float | None, float | None]:
    """The interval's ends for a chart; an end beyond WIDE times (or below 1/WIDE of) the estimate is drawn
    as unbounded, off the axis, so an end of 1e6 does not squash the axis."""
    low, high = record.low, record.high
    if not has_interval(record) or not is_words(record.interval_text()):
        return low, high
    shift = 1.0 if isinstance(record, MetricVerdict) else 0.0  # a baseline verdict's ends are changes
    value = float(record.delta or 0.0) + 1.0 if shift else float(record.ratio)
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


def check_row(test: TestDocument, c: Check) -> VerdictRow:
    outcome = record_outcome(c.outcome, test_outcome(test) == "xfail")
    notes = ["a declared known gap (strict xfail)"] if outcome == "xfail" else []
    probe = isinstance(c, ProbeCheck)  # a ratio check is always "at most"
    absolute = probe and c.b == "limit"
    sign = LIMIT_SIGN[c.direction if isinstance(c, ProbeCheck) else "at_most"]
    if c.unit == "rel":
        value, limit = f"{c.ratio:.1e}", f"≤ {c.threshold:.0e}"
    elif absolute:
        value, limit = fmt_unit(c.ratio, c.unit), f"{sign} {fmt_unit(c.threshold, c.unit)}"
    else:
        value, limit = f"{c.ratio:.3f}×", f"{sign} {c.threshold:g}×"
    if c.method == "paired":  # the noise the interval is made of, shown next to it
        notes.append(f"{c.pairs} pairs, pair-to-pair {pair_to_pair(c.method, c.pair_cv)}")
    if getattr(c, "secondary", ""):  # a figure shown beside the one that decided (CPU memory: host RSS growth)
        notes.append(c.secondary)
    subject = f"{c.name}: {c.a}" + ("" if absolute else f" vs {c.b}")
    return VerdictRow(test.nodeid, "probe" if probe else "ratio", subject, value, interval_cell(c), limit,
                      outcome, "; ".join(notes))


def limit_cell(v: MetricVerdict) -> str:
    """The verdict's limit as the terminal words it: one-sided, the worsening that fails ('+5.0%', not '± 5.0%'),
    'exact' for a count."""
    if v.threshold is None:
        return "–"
    return "exact" if v.metric_kind == "count" else f"{v.threshold:+.1%}"


def verdict_row(test: TestDocument, v: MetricVerdict) -> VerdictRow:
    outcome = record_outcome(v.status, test_outcome(test) == "xfail")
    fails = v.fails and outcome != "fail"  # e.g. 'new' under --distperf-require-baseline
    limit = limit_cell(v)
    delta = "–" if v.delta is None else f"{v.delta:+.1%}"
    arrow = " base → head " if v.reference else " → "  # head vs base (decide/against.py): both commits
    value = f"{delta} ({fmt_unit(v.baseline, v.unit)}{arrow}{fmt_unit(v.current, v.unit)})"
    subject = f"{v.metric} of {v.job}" + (f", {v.reference}" if v.reference else "")
    note = "; ".join(x for x in (v.note, v.secondary) if x)  # the secondary figure beside the one that decided
    return VerdictRow(test.nodeid, "baseline", subject, value, interval_cell(v), limit, outcome, note, fails)


def verdict_rows(tests: Iterable[TestDocument]) -> list[VerdictRow]:
    """Every check and baseline verdict of every test, plus a row for a test that failed without one."""
    rows: list[VerdictRow] = []
    for t in tests:
        own = [check_row(t, c) for c in t.checks] + [verdict_row(t, v) for v in t.verdicts]
        outcome = test_outcome(t)
        if not own or outcome in ("fail", "error") and not any(r.outcome == "fail" for r in own):
            message = (t.message or "").strip().splitlines()
            failure = " ".join((t.failure or "").split())  # the exception's message (session.failure_text)
            own.append(VerdictRow(t.nodeid, "test", "test outcome", "–", "–", "–", outcome,
                                  failure[:300] if failure else (message[-1][:200] if message else "")))
        rows += own
    return rows


@dataclass
class SharedRow:
    row: VerdictRow
    tests: list[str]  # every test that carries this row (tests sharing a comparison's runs carry the same)


def shared(items: Iterable[tuple[str, T]], key: Callable[[T], Hashable]) -> list[tuple[T, list[str]]]:
    """Each item once (by `key`), in the order first seen, with every test that carries it: tests that share a
    job's runs carry the same records."""
    found: dict[Hashable, tuple[T, list[str]]] = {}
    for test, item in items:
        found.setdefault(key(item), (item, []))[1].append(test)
    return list(found.values())


def shared_rows(rows: Iterable[VerdictRow]) -> list[SharedRow]:
    return [SharedRow(row, tests) for row, tests in shared(((r.test, r) for r in rows), lambda r: (
        r.kind, r.subject, r.value, r.interval, r.limit, r.outcome, r.note, r.fails))]


def run_steps(run: Mapping[str, Any]) -> list[float]:
    return [float(t) for t in run["step_times"]]


def probe_records(tests: Iterable[TestDocument]) -> list[tuple[ProbeSummary, list[str]]]:
    """Probe records, each once."""
    return shared(((t.nodeid, p) for t in tests for p in t.probes),
                  lambda p: json.dumps([p.label, p.traces, p.metrics], sort_keys=True, default=str))
