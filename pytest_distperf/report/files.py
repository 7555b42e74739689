"""Session reports for CI: the JSON report, the Markdown job summary, the pytest-benchmark export.

They read the session document and compute nothing new, except the summary statistics pytest-benchmark's
format asks for.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import statistics
from typing import Any, Iterable

from pytest_distperf.report import out_of_budget
from pytest_distperf.report.document import SessionDocument, TestDocument, unique_jobs
from pytest_distperf.report.outcomes import OUTCOME_MARK
from pytest_distperf.report.rows import md_cell
from pytest_distperf.report.terminal import baseline_row
from pytest_distperf.fs.jsonio import write_json_atomic
from pytest_distperf.figures.units import fmt_bytes, fmt_seconds
from pytest_distperf.figures.wording import pair_to_pair, short_test
from pytest_distperf.figures.quantities import SCOPES
from pytest_distperf.figures.stats import quantile

BENCHMARK_FORMAT_VERSION = "5.1.0"  # the pytest-benchmark JSON layout this export follows (5.x)


# -- JSON report ------------------------------------------------------------------------------------------------
def json_report(entries: Iterable[TestDocument], environment: dict[str, Any], invocation: dict[str, Any]) -> dict:
    return SessionDocument(list(entries), environment, invocation).to_json()


# -- Markdown job summary ---------------------------------------------------------------------------------------
NO_TEST = "no distperf test ran"  # the PR comment's words for a session without one (report/pr_comment.py)


def markdown_summary(entries: Iterable[TestDocument]) -> str:
    entries = list(entries)
    if not entries:  # nothing selected (exit 5), or no test used distperf: said, not left out
        return f"## distperf\n\n**{NO_TEST}** (0 tests)\n"
    lines = _md_counts(entries) + out_of_budget.markdown_lines(entries)  # not measured: as visible as a failure
    if lines[-1] != "":
        lines.append("")
    for section in (_md_undecided(entries), _md_jobs(entries), _md_verdicts(entries), _md_checks(entries)):
        lines += section + ([""] if section else [])
    for e in entries:
        if e.outcome in ("failed", "error"):
            reason = " ".join((e.failure or "").split())[:300]  # session.failure_text
            reason = reason.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            lines += [f"<details><summary>✗ {md_cell(e.nodeid)}" + (f": {md_cell(reason)}" if reason else "")
                      + "</summary>", "", "```text", (e.message or "(no message)").strip()[:4000], "```",
                      "</details>", ""]
    return "\n".join(lines) + "\n"


def _md_row(cells: list[str]) -> str:
    return "| " + " | ".join(map(md_cell, cells)) + " |"


def _md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [_md_row(header), "|" + "---|" * len(header)] + [_md_row(r) for r in rows] if rows else []


def _md_counts(entries: list[TestDocument]) -> list[str]:
    failed = sum(e.outcome in ("failed", "error") for e in entries)
    unmeasured = len(out_of_budget.out_of_budget(entries))
    classes = sorted({e.machine_class for e in entries if e.machine_class})
    return ["## distperf", "",
            f"**{len(entries)} test(s)**: {sum(e.outcome == 'passed' for e in entries)} passed, {failed} failed"
            + (f", {out_of_budget.count_text(unmeasured)}" if unmeasured else "")
            + (f" · machine class {', '.join(f'`{c}`' for c in classes)}" if classes else "")
            + "".join(f" · {label}" for label in _references(entries)), ""]


def _references(entries: list[TestDocument]) -> list[str]:
    """Head vs base (--distperf-against): 'head 03dfeb6b... vs base e5bebb81... (merge base of main and HEAD)',
    as the terminal, the PR comment and the JSON report name both commits; [] against stored baselines."""
    labels = [str((e.context.against or {}).get("label") or "") for e in entries if e.context is not None]
    labels += [v.reference for e in entries for v in e.verdicts]
    return [label for label in dict.fromkeys(labels) if label]


def _md_undecided(entries: list[TestDocument]) -> list[str]:
    """As visible as a failure: an undecided verdict is not a pass."""
    from pytest_distperf.report.undecided import STRICT_HINT, subject, undecided, undecided_text

    found = undecided(entries)
    if not found:
        return []
    return ([f"**⚠ {len(found)} undecided (inconclusive) verdict(s)**: neither passed nor failed ({STRICT_HINT})", ""]
            + [f"- `{md_cell(short_test(n))}`: {md_cell(subject(r))}: {md_cell(undecided_text(r))}" for n, r in found])


def _md_jobs(entries: list[TestDocument]) -> list[str]:
    rows = [[short_test(e.nodeid), f.label, str(f.runs), fmt_seconds(f.step_time),
             "-" if f.run_cv is None else f"{f.run_cv:.1%}", fmt_bytes(f.peak_memory)]
            for e in entries for f in (j.figures for j in e.jobs)]
    if not rows:
        return []
    return (_md_table(["test", "job", "runs", "step time", "run-to-run", "peak memory"], rows)
            + ["", f"step time: {SCOPES['step_time'][1]}; peak memory: {SCOPES['peak_memory'][1]}"])


def _md_verdicts(entries: list[TestDocument]) -> list[str]:
    """The verdicts against stored baselines (baseline / current), then head vs base's under their commits
    (base / head), as the terminal shows them."""
    lines = _md_table(["test", "job", "metric", "baseline", "current", "Δ", "98% interval", "status"],
                      [baseline_row(e.nodeid, v) for e in entries for v in e.verdicts if not v.reference])
    for reference in dict.fromkeys(v.reference for e in entries for v in e.verdicts if v.reference):
        rows = [baseline_row(e.nodeid, v) for e in entries for v in e.verdicts if v.reference == reference]
        lines += ([""] if lines else []) + [f"**{md_cell(reference)}**", ""] + _md_table(
            ["test", "job", "metric", "base", "head", "Δ", "98% interval", "status"], rows)
    return lines


def _md_checks(entries: list[TestDocument]) -> list[str]:
    rows = []
    for e, c in ((e, c) for e in entries for c in e.checks):
        ratio = f"{c.ratio:.3f}" if c.unit != "rel" else f"{c.ratio:.1e}"
        if c.method == "paired":
            ratio += f" {c.interval_text()}"  # in words where the design cannot bound it (wording.bound_text)
        rows.append([short_test(e.nodeid), c.name, ratio, str(c.pairs) if c.method == "paired" else "-",
                     pair_to_pair(c.method, c.pair_cv), f"{c.threshold:g}", OUTCOME_MARK[c.outcome]])
    return _md_table(["test", "check", "ratio A/B [98% interval]", "pairs", "pair-to-pair", "limit", "verdict"], rows)


# -- pytest-benchmark export ------------------------------------------------------------------------------------
def benchmark_json(entries: Iterable[TestDocument], environment: dict[str, Any]) -> dict[str, Any]:
    """The step times of every job (each once) in pytest-benchmark 5.x's saved-JSON layout, readable by
    `pytest-benchmark compare` and github-action-benchmark (tool: pytest)."""
    benchmarks = []
    for shared in unique_jobs(entries):
        e, job = shared.test, shared.job
        verdicts = {(v.job, v.metric): v for v in e.verdicts}
        steps = [t for r in job.runs for t in r["step_times"]]
        if not steps:
            continue
        v = verdicts.get((job.label, "step_time"))
        name = f"{short_test(e.nodeid)}[{job.label}]"
        benchmarks.append({
            "group": e.nodeid.split("::", 1)[0], "name": name, "fullname": f"{e.nodeid}[{job.label}]",
            "params": {"job": job.label}, "param": job.label,
            "extra_info": {
                "machine_class": e.machine_class, "config_hash": job.config_hash, "runs": len(job.runs),
                # the job's figures as every report shows them (figures/quantities.py); stats below are per step
                "step_time": job.figures.step_time, "step_time_scope": SCOPES["step_time"][1],
                "run_to_run": job.figures.run_cv, "peak_memory_bytes": job.figures.peak_memory,
                "tokens_per_step": job.runs[0]["tokens_per_step"],
                "baseline_status": v.status if v else None, "baseline_delta": v.delta if v else None,
            },
            "options": {"disable_gc": False, "timer": "perf_counter", "min_rounds": len(steps), "max_time": 0.0,
                        "min_time": 0.0, "warmup": job.config.get("warmup_steps", 0)},
            "stats": _bench_stats(steps),
        })
    return {
        "machine_info": {
            "node": environment.get("host") or platform.node(), "processor": platform.processor(),
            "machine": platform.machine(), "python_compiler": platform.python_compiler(),
            "python_implementation": platform.python_implementation(),
            "python_implementation_version": platform.python_version(), "python_version": platform.python_version(),
            "python_build": list(platform.python_build()), "release": platform.release(), "system": platform.system(),
            "cpu": {"brand_raw": environment.get("cpu"), "count": os.cpu_count()},
            "distperf_environment": environment,
        },
        "commit_info": {"id": environment.get("git_commit") or "unknown", "time": None, "author_time": None,
                        "dirty": False, "project": "pytest-distperf", "branch": "(unknown)"},
        "benchmarks": benchmarks,
        "datetime": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "version": BENCHMARK_FORMAT_VERSION,
    }


def _bench_stats(data: list[float]) -> dict[str, Any]:
    """pytest-benchmark's Stats fields over the measured step times (seconds; one round = one step)."""
    q1, q3 = quantile(data, 0.25), quantile(data, 0.75)
    iqr = q3 - q1
    mean = statistics.fmean(data)
    sd = statistics.stdev(data) if len(data) > 1 else 0.0
    inside = [x for x in data if q1 - 1.5 * iqr <= x <= q3 + 1.5 * iqr] or data
    sd_out = sum(1 for x in data if not mean - sd <= x <= mean + sd)
    iqr_out = len(data) - len(inside)
    return {"min": min(data), "max": max(data), "mean": mean, "stddev": sd, "rounds": len(data),
            "median": statistics.median(data), "iqr": iqr, "q1": q1, "q3": q3, "iqr_outliers": iqr_out,
            "stddev_outliers": sd_out, "outliers": f"{sd_out};{iqr_out}", "ld15iqr": min(inside),
            "hd15iqr": max(inside), "ops": 1.0 / mean if mean > 0 else 0.0, "total": sum(data), "data": list(data),
            "iterations": 1}


def session_environment(entries: list[TestDocument], rootdir: str, device: str = "cpu") -> dict[str, Any]:
    """The environment the tests recorded (the first one that did), else this process's for `device`
    (a session interrupted before any test finished still says which CUDA, NCCL and driver it ran on)."""
    for e in entries:
        if e.context is not None and e.context.environment:
            return e.context.environment
    from pytest_distperf.launch.fingerprint import soft_metadata

    return soft_metadata(device, rootdir)


def write_session_reports(entries: list[TestDocument], rootdir: str, json_path: str | None,
                          benchmark_path: str | None, step_summary_path: str | None,
                          invocation: dict[str, Any], device: str = "cpu", html_path: str | None = None,
                          pr_comment_path: str | None = None, html_url: str | None = None,
                          history_url: str | None = None, enabled: bool = False) -> list[str]:
    """Write the reports asked for, all drawn from the one redacted JSON report document (appended to the
    history first, with `history_url`); returns what was written, one line each. `enabled`: the session ran with
    --distperf; a session with it and no
    distperf test (none selected, exit 5) still appends its line to the job summary, as the PR comment says it."""
    written: list[str] = []
    step_summary_path = step_summary_path if step_summary_path and (entries or enabled) else None
    if not (json_path or benchmark_path or html_path or pr_comment_path or step_summary_path
            or (history_url and entries)):
        return written
    from pytest_distperf.store.redact import redact, redact_text

    # The one redaction (redact.py): every report below is drawn from these redacted documents.
    environment = redact(session_environment(entries, rootdir, device))
    doc = redact(json_report(entries, environment, invocation))
    if json_path:
        write_json_atomic(json_path, doc, lock=False)
        written.append(f"JSON report {json_path}")
    history: list[Any] = []
    history_error = None
    if history_url and entries:
        from pytest_distperf.store.history import HistoryError

        try:
            history = _record_history(history_url, doc, bool(html_path), written)
        except HistoryError as e:  # the other reports are still written; the error fails the run after them
            history_error = e
    if html_path:
        from pytest_distperf.report.html import write_html

        write_html(html_path, doc, history)
        written.append(f"HTML report {html_path} ({os.path.getsize(html_path) / 1024:.0f} KiB)")
    if pr_comment_path:
        from pytest_distperf.report.pr_comment import write_pr_comment

        write_pr_comment(pr_comment_path, doc, redact_text(html_url) if html_url else html_url, html_path)
        written.append(f"PR comment {pr_comment_path}")
    if benchmark_path:
        write_json_atomic(benchmark_path, redact(benchmark_json(entries, environment)), lock=False)
        written.append(f"pytest-benchmark JSON {benchmark_path}")
    if step_summary_path:
        with open(step_summary_path, "a", encoding="utf-8") as f:  # $GITHUB_STEP_SUMMARY: each step appends
            f.write(redact_text(markdown_summary(entries)))
        written.append(f"job summary to {step_summary_path}")
    if history_error is not None:
        raise history_error
    return written


def _record_history(history_url: str, doc: dict[str, Any], trends: bool, written: list[str]) -> list[Any]:
    """Append the session's document to the history; with `trends`, the trend series of its metrics."""
    from pytest_distperf.report.charts import trend_series
    from pytest_distperf.store.history import record_session, session_trends

    recorded = record_session(history_url, doc)
    written.append(f"history: session {recorded.session_id} ({recorded.rows} values"
                   f"{', already recorded' if recorded.duplicate else ''}) in {recorded.where}")
    return trend_series(session_trends(history_url, doc)) if trends else []
