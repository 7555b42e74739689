"""The HTML report's view model: what each section of the page shows, as plain data and drawn charts.

`report_view` is the one place that reads the session document; the templates only lay the view out, escaping
every text they insert. Nothing is measured or decided here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from markupsafe import Markup

from pytest_distperf.launch import fingerprint
from pytest_distperf.decide.checks import Check
from pytest_distperf.decide.probe_checks import ProbeCheck
from pytest_distperf.decide.verdicts import MetricVerdict
from pytest_distperf.figures.explain import Explanation
from pytest_distperf.report.charts import (TrendSeries, bar_chart, contribution_chart, interval_chart, strip_chart,
                                          trend_chart)
from pytest_distperf.report.document import JobRecord, SessionDocument, TestDocument, unique_jobs
from pytest_distperf.report.job_views import JobSection, ProbeSection, job_sections, probe_sections
from pytest_distperf.report.outcomes import counted, record_outcome, test_outcome
from pytest_distperf.figures.wording import short_test
from pytest_distperf.report.rows import (VerdictRow, chart_ends, fmt_unit, has_interval, level_text, run_steps,
                                         shared, shared_rows, verdict_row, verdict_rows)
from pytest_distperf.report.svg import SIDE_COLOURS, legend

QUIET = ("pass", "new", "not comparable", "skipped")  # baseline verdicts listed in a collapsed table
BASELINE_GREY = "#8c959f"
KeyValues = list[tuple[str, Any]]


@dataclass
class TestsCell:
    """The tests a row belongs to: the first by name with its outcome, the others counted (named on hover)."""

    first: str
    outcome: str
    others: list[str]


@dataclass
class RowView:
    row: VerdictRow
    tests: TestsCell
    nodeids: list[str]  # every test's full node id (what a test of the page matches rows by)


@dataclass
class Summary:
    tests: int
    test_counts: list[tuple[str, int]]
    verdict_counts: list[tuple[str, int]]
    machine_classes: list[str]
    commit: str
    written: str


@dataclass
class Verdicts:
    any_test: bool
    checks: list[RowView]
    loud: list[RowView]  # baseline verdicts that need a look, in the open table
    quiet: list[RowView]
    quiet_counts: str  # '2 new, 1 pass'


@dataclass
class ComparisonView:
    """One ratio check of a test: its A/B against the limit, and each side's runs."""

    test: str
    name: str
    outcome: str
    runs: Markup | None  # legend and chart of each run's values; None: not a ratio of two jobs' runs
    runs_missing: bool  # the document has no per-job detail for this test
    ratio: Markup


@dataclass
class Baseline:
    metric: str
    job: str
    row: VerdictRow
    tests: TestsCell
    threshold_text: str
    distribution: Markup | None
    delta: Markup | None
    trend: Markup | None
    # what changed by operator/kernel: its headline, table header and rows; empty: none
    explain_head: str = ""
    explain_header: list[str] = field(default_factory=list)
    explain_rows: list[list[str]] = field(default_factory=list)
    explain_chart: Markup | None = None  # the rows that stand out, by their change in time


@dataclass
class Baselines:
    shown: list[Baseline]
    without: int  # metrics with no baseline (and no history) on this machine class


@dataclass
class Environment:
    environment: KeyValues
    machines: list[tuple[str, KeyValues]]
    noise: list[tuple[str, str, str]]  # job, other load per run, run-to-run variation
    invocation: KeyValues


@dataclass
class ReportView:
    title: str
    subtitle: str
    summary: Summary
    verdicts: Verdicts
    comparisons: list[ComparisonView]
    jobs: list[JobSection]
    probes: list[ProbeSection]
    baselines: Baselines
    environment: Environment
    sections: Sequence[tuple[str, str]] = field(default_factory=lambda: SECTIONS)


SECTIONS = (("summary", "summary"), ("verdicts", "verdicts"), ("comparisons", "comparisons"), ("jobs", "jobs"),
            ("probes", "probes"), ("baselines", "baselines"), ("environment", "environment and noise"))


def report_view(session: SessionDocument, history: Iterable[TrendSeries] = (),
                title: str = "distperf report") -> ReportView:
    """The whole page's view of one session document; `history`: trend series of its metrics."""
    env, tests = session.environment, session.tests
    outcomes = {t.nodeid: test_outcome(t) for t in tests}
    rows = [RowView(s.row, tests_cell(s.tests, outcomes), s.tests) for s in shared_rows(verdict_rows(tests))]
    subtitle = " · ".join(x for x in (session.created_at, (fingerprint.commit_text(env) if env.get("git_commit") else ""), env.get("host") or "")
                          if x)
    return ReportView(title=title, subtitle=subtitle, summary=_summary(session, rows), verdicts=_verdicts(rows),
                      comparisons=_comparisons(tests), jobs=job_sections(tests), probes=probe_sections(tests),
                      baselines=_baselines(tests, {s.key: s for s in history}, outcomes),
                      environment=_environment(session))


def tests_cell(tests: Sequence[str], outcomes: Mapping[str, str]) -> TestsCell:
    return TestsCell(short_test(tests[0]), outcomes.get(tests[0], "unknown"), [short_test(t) for t in tests[1:]])


def _summary(session: SessionDocument, rows: Sequence[RowView]) -> Summary:
    tests = session.tests
    return Summary(tests=len(tests), test_counts=counted(test_outcome(t) for t in tests),
                   verdict_counts=counted(r.row.outcome for r in rows if r.row.kind != "test"),
                   machine_classes=sorted({t.machine_class for t in tests if t.machine_class}),
                   commit=fingerprint.commit_text(session.environment).replace("?", "–"), written=session.created_at or "–")


def _verdicts(rows: Sequence[RowView]) -> Verdicts:
    baseline = [r for r in rows if r.row.kind == "baseline"]
    quiet = [r for r in baseline if r.row.outcome in QUIET and not r.row.fails]
    counts = sorted(Counter(r.row.outcome for r in quiet).items())
    return Verdicts(any_test=bool(rows), checks=[r for r in rows if r.row.kind != "baseline"],
                    loud=[r for r in baseline if r.row.outcome not in QUIET or r.row.fails], quiet=quiet,
                    quiet_counts=", ".join(f"{n} {o}" for o, n in counts))


def _job_by_label(test: TestDocument, label: str) -> JobRecord | None:
    return next((j for j in test.jobs if j.label == label), None)


def _comparisons(tests: Iterable[TestDocument]) -> list[ComparisonView]:
    out = []
    for t in tests:
        xfailed = test_outcome(t) == "xfail"
        for c in t.checks:
            if c.unit == "rel":
                continue  # loss agreement: a number, in the verdict table
            outcome = record_outcome(c.outcome, xfailed)
            runs, missing = None, False
            if not isinstance(c, ProbeCheck):
                a, b = _job_by_label(t, c.a), _job_by_label(t, c.b)
                missing = a is None or b is None or not (a.runs and b.runs)
                runs = None if missing or a is None or b is None else _comparison_runs(c, a, b)
            if isinstance(c, ProbeCheck) and c.b == "limit":
                fmt, name, ref = (lambda v, u=c.unit: fmt_unit(v, u)), c.name, None
            else:
                fmt, name, ref = (lambda v: f"{v:.3g}×"), "A/B", 1.0
            ratio = interval_chart(c.ratio, *chart_ends(c), c.threshold,
                                   c.direction if isinstance(c, ProbeCheck) else "at_most",
                                   f"{name} against its limit", "ratio", outcome, value_name=name, fmt=fmt, ref=ref,
                                   interval=level_text(c) if has_interval(c) else None)
            out.append(ComparisonView(short_test(t.nodeid), c.name, outcome, runs, missing, ratio))
    return out


def _comparison_runs(c: Check, a: JobRecord, b: JobRecord) -> Markup:
    sides = ((f"A {c.a}", a, SIDE_COLOURS[0], "circle"), (f"B {c.b}", b, SIDE_COLOURS[1], "square"))
    if c.unit == "s":
        rows: list[tuple[str, list[float], str, str]] = []
        for i in range(max(len(a.runs), len(b.runs))):  # the order they ran in: A B A B ...
            for tag, job, colour, marker in sides:
                if i < len(job.runs):
                    rows.append((f"{tag[0]} run {i + 1}", run_steps(job.runs[i]), colour, marker))
        key = legend([("circle", SIDE_COLOURS[0], f"A = {c.a}"), ("square", SIDE_COLOURS[1], f"B = {c.b}"),
                      ("bar", "#24292f", "median of the run")])
        return Markup(key) + strip_chart(rows, "s", f"step times of each run of {c.a} and {c.b}", "strip runs")
    bars = [(f"{tag[0]} run {i + 1}", value, colour, f"{tag}: run {i + 1}")
            for tag, job, colour, _ in sides for i, run in enumerate(job.runs)
            if (value := _run_memory(run, c.name)) is not None]
    key = legend([("bar", SIDE_COLOURS[0], f"A = {c.a}"), ("bar", SIDE_COLOURS[1], f"B = {c.b}")])
    what = "training state" if c.name == "train_memory" else "peak memory"
    return Markup(key) + bar_chart(bars, "bytes", f"{what} of each run", "bars runs-memory")


def _run_memory(run: Mapping[str, Any], metric: str) -> float | None:
    """A report run's memory figure: `train_memory` from its work figures, else its peak memory."""
    value = (run.get("work") or {}).get("train_memory") if metric == "train_memory" else run.get("peak_memory")
    return None if value is None else float(value)


def _verdict_key(record: tuple[TestDocument, MetricVerdict]) -> tuple[Any, ...]:
    v = record[1]
    return (v.job, v.metric, v.current, v.baseline, v.status, v.delta)


def _baselines(tests: Sequence[TestDocument], history: Mapping[tuple[str, str, str], TrendSeries],
               outcomes: Mapping[str, str]) -> Baselines:
    """A chart per verdict that has a baseline to compare with, or a history (tests sharing runs show it once);
    metrics without either are counted."""
    shown, without = [], 0
    for (t, v), nodeids in shared(((t.nodeid, (t, v)) for t in tests for v in t.verdicts), _verdict_key):
        series = history.get((t.nodeid, v.job, v.metric))
        has_trend = series is not None and bool(series.points)
        if v.baseline is None and not has_trend:
            without += 1
            continue
        row, thr = verdict_row(t, v), v.threshold
        delta = None if v.delta is None else interval_chart(
            v.delta, *chart_ends(v), None, "at_most", "change against the baseline", "delta", row.outcome,
            value_name="Δ", fmt=lambda x: f"{x:+.1%}", ref=0.0, band=(-thr, thr) if thr is not None else None,
            interval=level_text(v) if has_interval(v) else None)
        view = Baseline(metric=v.metric, job=v.job, row=row, tests=tests_cell(nodeids, outcomes),
                        threshold_text=v.threshold_text or "–",
                        distribution=_baseline_distribution(t, v) if v.baseline is not None else None,
                        delta=delta, trend=trend_chart(series) if has_trend and series is not None else None)
        if v.explanation:
            sides = ("base", "head") if v.reference else ("baseline", "current")
            diff = Explanation.from_json(v.explanation)
            view.explain_head, view.explain_header, view.explain_rows = (diff.headline(sides), diff.header(sides),
                                                                         diff.cells())
            bars = diff.contributions()
            if bars:
                view.explain_chart = contribution_chart(bars, f"what changed in {v.job}, {sides[1]} against "
                                                              f"{sides[0]}")
        shown.append(view)
    return Baselines(shown=shown, without=without)


def _baseline_distribution(test: TestDocument, v: MetricVerdict) -> Markup | None:
    """The stored runs the verdict was decided against beside the current ones (a report older than those
    fields: the current runs alone)."""
    job = _job_by_label(test, v.job)
    runs = job.runs if job else []
    if v.metric == "step_time" and runs:
        rows = [(f"baseline run {i + 1}", [float(x) for x in s], BASELINE_GREY, "square")
                for i, s in enumerate(v.baseline_samples)]
        rows += [(f"current run {i + 1}", run_steps(r), SIDE_COLOURS[0], "circle") for i, r in enumerate(runs)]
        return strip_chart(rows, "s", f"baseline vs current step times of {v.job}", "strip baseline")
    current = ([x for r in runs if (x := _run_memory(r, v.metric)) is not None]
               if v.metric in ("peak_memory", "train_memory") else [])
    bars = [(f"baseline run {i + 1}", float(x), BASELINE_GREY, "") for i, x in enumerate(v.baseline_values)]
    bars += [(f"current run {i + 1}", x, SIDE_COLOURS[0], "") for i, x in enumerate(current)]
    if not current and v.current is not None:
        bars.append(("current", float(v.current), SIDE_COLOURS[0], ""))
    if not bars:
        return None
    return bar_chart(bars, v.unit, f"baseline vs current {v.metric} of {v.job}", "bars baseline")


def _key_values(items: Mapping[str, Any]) -> KeyValues:
    return [(k, "–" if v is None else v) for k, v in sorted(items.items())]


def _environment(session: SessionDocument) -> Environment:
    machines: dict[str, Any] = {}
    for t in session.tests:
        if t.context is not None:
            machines.setdefault(t.context.machine_class, t.context.machine)
    return Environment(environment=_key_values(session.environment),
                       machines=[(name, _key_values(m)) for name, m in machines.items()],
                       noise=_noise(session.tests), invocation=_key_values(session.invocation))


def _noise(tests: Iterable[TestDocument]) -> list[tuple[str, str, str]]:
    """Per job: other work's load on the host during each run, and the step time's run-to-run variation."""
    rows = []
    for shared in unique_jobs(tests):
        job = shared.job
        loads = [r.get("host_other_load_cores") for r in job.runs]
        cv = job.figures.run_cv
        rows.append((job.label, ", ".join("–" if x is None else f"{x:.2f}" for x in loads) or "–",
                     "–" if cv is None else f"{cv:.1%} over {job.figures.runs} runs"))
    return rows
