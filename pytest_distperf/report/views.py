"""The HTML report's view model: what each section of the page shows, as plain data and drawn charts.

`report_view(doc, history)` is the one place that reads the `--distperf-json` document (never the baseline
files it names: each verdict carries its stored runs); the templates (report/templates) only lay the view out,
escaping every text they insert.
Charts arrive drawn (report/charts.py, as Markup). Nothing is measured or decided here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from markupsafe import Markup

from pytest_distperf.report.charts import TrendSeries, bar_chart, interval_chart, strip_chart, trend_chart
from pytest_distperf.report.job_views import JobSection, ProbeSection, job_sections, probe_sections
from pytest_distperf.report.outcomes import check_outcome, counted, test_outcome
from pytest_distperf.measure.wording import short_test
from pytest_distperf.report.rows import (VerdictRow, chart_ends, fmt_unit, has_interval, level_text, run_steps,
                                         shared_rows, unique_jobs, verdict_row, verdict_rows)
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
class Comparison:
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
    comparisons: list[Comparison]
    jobs: list[JobSection]
    probes: list[ProbeSection]
    baselines: Baselines
    environment: Environment
    sections: Sequence[tuple[str, str]] = field(default_factory=lambda: SECTIONS)


SECTIONS = (("summary", "summary"), ("verdicts", "verdicts"), ("comparisons", "comparisons"), ("jobs", "jobs"),
            ("probes", "probes"), ("baselines", "baselines"), ("environment", "environment and noise"))


def report_view(doc: Mapping[str, Any], history: Iterable[TrendSeries] = (),
                title: str = "distperf report") -> ReportView:
    """The whole page's view of one JSON report document; `history`: trend series of its metrics."""
    env = doc.get("environment") or {}
    outcomes = {t["nodeid"]: test_outcome(t) for t in doc["tests"]}
    rows = [RowView(s.row, tests_cell(s.tests, outcomes), s.tests) for s in shared_rows(verdict_rows(doc))]
    subtitle = " · ".join(x for x in (doc.get("created_at") or "", (env.get("git_commit") or "")[:12],
                                      env.get("host") or "") if x)
    return ReportView(title=title, subtitle=subtitle, summary=_summary(doc, rows), verdicts=_verdicts(doc, rows),
                      comparisons=_comparisons(doc), jobs=job_sections(doc), probes=probe_sections(doc),
                      baselines=_baselines(doc, {s.key: s for s in history}, outcomes),
                      environment=_environment(doc))


def tests_cell(tests: Sequence[str], outcomes: Mapping[str, str]) -> TestsCell:
    return TestsCell(short_test(tests[0]), outcomes.get(tests[0], "unknown"), [short_test(t) for t in tests[1:]])


def _summary(doc: Mapping[str, Any], rows: Sequence[RowView]) -> Summary:
    env = doc.get("environment") or {}
    return Summary(tests=len(doc["tests"]), test_counts=counted(test_outcome(t) for t in doc["tests"]),
                   verdict_counts=counted(r.row.outcome for r in rows if r.row.kind != "test"),
                   machine_classes=sorted({t.get("machine_class") for t in doc["tests"]} - {None}),
                   commit=(env.get("git_commit") or "–")[:12], written=doc.get("created_at") or "–")


def _verdicts(doc: Mapping[str, Any], rows: Sequence[RowView]) -> Verdicts:
    baseline = [r for r in rows if r.row.kind == "baseline"]
    quiet = [r for r in baseline if r.row.outcome in QUIET and not r.row.fails]
    counts: dict[str, int] = {}
    for r in quiet:
        counts[r.row.outcome] = counts.get(r.row.outcome, 0) + 1
    return Verdicts(any_test=bool(rows), checks=[r for r in rows if r.row.kind != "baseline"],
                    loud=[r for r in baseline if r.row.outcome not in QUIET or r.row.fails], quiet=quiet,
                    quiet_counts=", ".join(f"{n} {o}" for o, n in sorted(counts.items())))


def _job_by_label(test: Mapping[str, Any], label: str) -> dict[str, Any] | None:
    return next((j for j in test.get("jobs") or [] if j.get("label") == label), None)


def _comparisons(doc: Mapping[str, Any]) -> list[Comparison]:
    out = []
    for t in doc["tests"]:
        xfailed = test_outcome(t) == "xfail"
        for c in t["checks"]:
            if c.get("unit") == "rel":
                continue  # loss agreement: a number, in the verdict table
            outcome = check_outcome(c, xfailed)
            probe = "direction" in c
            runs, missing = None, False
            if not probe:
                a, b = _job_by_label(t, c["a"]), _job_by_label(t, c["b"])
                missing = a is None or b is None
                runs = None if a is None or b is None else _comparison_runs(c, a, b)
            if probe and c["b"] == "limit":
                unit = c.get("unit", "")
                fmt, name, ref = (lambda v, u=unit: fmt_unit(v, u)), c.get("name", "value"), None
            else:
                fmt, name, ref = (lambda v: f"{v:.3g}×"), "A/B", 1.0
            ratio = interval_chart(float(c["ratio"]), *chart_ends(c), float(c["threshold"]),
                                   c["direction"] if probe else "at_most", f"{name} against its limit", "ratio",
                                   outcome, value_name=name, fmt=fmt, ref=ref,
                                   interval=level_text(c) if has_interval(c) else None)
            out.append(Comparison(short_test(t["nodeid"]), str(c.get("name")), outcome, runs, missing, ratio))
    return out


def _comparison_runs(c: Mapping[str, Any], a: Mapping[str, Any], b: Mapping[str, Any]) -> Markup:
    sides = ((f"A {c['a']}", a, SIDE_COLOURS[0], "circle"), (f"B {c['b']}", b, SIDE_COLOURS[1], "square"))
    if c.get("unit") == "s":
        rows: list[tuple[str, list[float], str, str]] = []
        for i in range(max(len(a["runs"]), len(b["runs"]))):  # the order they ran in: A B A B ...
            for tag, job, colour, marker in sides:
                if i < len(job["runs"]):
                    rows.append((f"{tag[0]} run {i + 1}", run_steps(job["runs"][i]), colour, marker))
        key = legend([("circle", SIDE_COLOURS[0], f"A = {c['a']}"), ("square", SIDE_COLOURS[1], f"B = {c['b']}"),
                      ("bar", "#24292f", "median of the run")])
        return Markup(key) + strip_chart(rows, "s", f"step times of each run of {c['a']} and {c['b']}", "strip runs")
    bars = [(f"{tag[0]} run {i + 1}", float(run["peak_memory"]), colour, f"{tag}: run {i + 1}")
            for tag, job, colour, _ in sides for i, run in enumerate(job["runs"]) if run.get("peak_memory") is not None]
    key = legend([("bar", SIDE_COLOURS[0], f"A = {c['a']}"), ("bar", SIDE_COLOURS[1], f"B = {c['b']}")])
    return Markup(key) + bar_chart(bars, "bytes", "peak memory of each run", "bars runs-memory")


def _verdict_key(v: Mapping[str, Any]) -> tuple[Any, ...]:
    return (v.get("job"), v.get("metric"), v.get("current"), v.get("baseline"), v.get("status"), v.get("delta"))


def _baselines(doc: Mapping[str, Any], history: Mapping[tuple[str, str, str], TrendSeries],
               outcomes: Mapping[str, str]) -> Baselines:
    """A chart per verdict that has a baseline to compare with, or a history (tests sharing runs show it once);
    metrics without either are counted."""
    shown, seen, without = [], set(), 0
    sharing: dict[tuple[Any, ...], list[str]] = {}
    for t in doc["tests"]:
        for v in t["verdicts"]:
            sharing.setdefault(_verdict_key(v), []).append(t["nodeid"])
    for t in doc["tests"]:
        for v in t["verdicts"]:
            key = _verdict_key(v)
            if key in seen:
                continue
            seen.add(key)
            series = history.get((t["nodeid"], str(v.get("job")), str(v.get("metric"))))
            has_trend = series is not None and bool(series.points)
            if v.get("baseline") is None and not has_trend:
                without += 1
                continue
            row = verdict_row(t, v)
            delta = None
            if v.get("delta") is not None:
                thr = v.get("threshold")
                delta = interval_chart(float(v["delta"]), *chart_ends(v), None, "at_most",
                                       "change against the baseline", "delta", row.outcome, value_name="Δ",
                                       fmt=lambda x: f"{x:+.1%}", ref=0.0,
                                       band=(-thr, thr) if thr is not None else None,
                                       interval=level_text(v) if has_interval(v) else None)
            shown.append(Baseline(
                metric=str(v.get("metric")), job=str(v.get("job")), row=row,
                tests=tests_cell(sharing[key], outcomes), threshold_text=v.get("threshold_text") or "–",
                distribution=_baseline_distribution(t, v) if v.get("baseline") is not None else None,
                delta=delta, trend=trend_chart(series) if has_trend and series is not None else None))
    return Baselines(shown=shown, without=without)


def _baseline_distribution(test: Mapping[str, Any], v: Mapping[str, Any]) -> Markup | None:
    """The stored runs the verdict was decided against (its baseline_values and baseline_samples) beside the
    current ones; a report older than those fields draws the current runs alone."""
    metric, label = str(v.get("metric")), str(v.get("job"))
    runs = (_job_by_label(test, label) or {}).get("runs") or []
    if metric == "step_time" and runs:
        rows = [(f"baseline run {i + 1}", [float(x) for x in s], BASELINE_GREY, "square")
                for i, s in enumerate(v.get("baseline_samples") or [])]
        rows += [(f"current run {i + 1}", run_steps(r), SIDE_COLOURS[0], "circle") for i, r in enumerate(runs)]
        return strip_chart(rows, "s", f"baseline vs current step times of {label}", "strip baseline")
    current = ([float(r["peak_memory"]) for r in runs if r.get("peak_memory") is not None]
               if metric == "peak_memory" else [])
    bars = [(f"baseline run {i + 1}", float(x), BASELINE_GREY, "") for i, x in enumerate(v.get("baseline_values") or [])]
    bars += [(f"current run {i + 1}", x, SIDE_COLOURS[0], "") for i, x in enumerate(current)]
    if not current and v.get("current") is not None:
        bars.append(("current", float(v["current"]), SIDE_COLOURS[0], ""))
    if not bars:
        return None
    return bar_chart(bars, str(v.get("unit") or ""), f"baseline vs current {metric} of {label}", "bars baseline")


def _key_values(items: Mapping[str, Any]) -> KeyValues:
    return [(k, "–" if v is None else v) for k, v in sorted(items.items())]


def _environment(doc: Mapping[str, Any]) -> Environment:
    machines: dict[str, Any] = {}
    for t in doc["tests"]:
        if t.get("machine_class"):
            machines.setdefault(t["machine_class"], t.get("machine") or {})
    return Environment(environment=_key_values(doc.get("environment") or {}),
                       machines=[(name, _key_values(m)) for name, m in machines.items()],
                       noise=_noise(doc), invocation=_key_values(doc.get("invocation") or {}))


def _noise(doc: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """Per job: other work's load on the host during each run, and the step time's run-to-run variation (the
    job's figure)."""
    rows = []
    for view in unique_jobs(doc):
        job = view.job
        loads = [r.get("host_other_load_cores") for r in job["runs"]]
        cv = (job.get("figures") or {}).get("run_cv")
        rows.append((str(job.get("label")), ", ".join("–" if x is None else f"{x:.2f}" for x in loads) or "–",
                     "–" if cv is None else f"{float(cv):.1%} over {len(job['runs'])} runs"))
    return rows
