"""The pull-request comment (`--distperf-pr-comment PATH`): the session's verdicts in at most 25 lines of Markdown.

Drawn from the session document's verdict rows (report/rows.py), like the HTML report. Every failing,
inconclusive and improved row, out-of-budget test and undecided verdict is listed and never cut: the comment
grows past 25 lines and says so. The marker line lets a workflow find and update the same comment.
"""

from __future__ import annotations

import os
import statistics
from collections import Counter
from typing import Any, Mapping, Sequence

from pytest_distperf.launch import fingerprint
from pytest_distperf.figures.explain import Explanation
from pytest_distperf.fs.jsonio import write_text_atomic
from pytest_distperf.report.outcomes import counted, mark, rank, test_outcome
from pytest_distperf.figures.wording import short_test
from pytest_distperf.report.document import SessionDocument, unique_jobs
from pytest_distperf.report.out_of_budget import count_text, markdown_lines, out_of_budget
from pytest_distperf.report.rows import SharedRow, md_cell, shared_rows, verdict_rows

MARKER = "<!-- distperf-pr-comment -->"
MAX_LINES = 25
HTML_URL_ENV = "DISTPERF_HTML_URL"
LISTED = ("fail", "error", "xpass", "inconclusive", "warn", "improved")  # outcomes every one of which is listed


def _counts_line(rows: Sequence[SharedRow], session: SessionDocument) -> str:
    decided = counted(s.row.outcome for s in rows if s.row.kind != "test")
    verdicts = " · ".join(f"{mark(o)} {n} {o}" for o, n in decided)
    outcome = ", ".join(f"{n} {o}" for o, n in counted(test_outcome(t) for t in session.tests))
    late = len(out_of_budget(session.tests))
    if late:  # skipped (or failed, --distperf-strict) unmeasured: counted apart, never read as a pass
        outcome += f", {count_text(late)}"
    if not session.tests:
        head = "no distperf test ran"
    elif any(s.row.outcome in ("fail", "error", "xpass") or s.row.fails for s in rows):
        head = "✗ failing"
    elif any(s.row.outcome in ("inconclusive", "warn") for s in rows):
        head = "? inconclusive"
    elif late:
        head = "⏱ not all measured"
    else:
        head = "✓ no regression"
    return f"### distperf: {head} — {verdicts or 'no verdicts'} ({len(session.tests)} tests: {outcome or '–'})"


def _listed_row(s: SharedRow) -> str:
    r = s.row
    more = f" (+{len(s.tests) - 1} tests)" if len(s.tests) > 1 else ""
    verdict = f"✗ {r.outcome}, fails" if r.fails else f"{mark(r.outcome)} {r.outcome}"
    what = f"{r.subject}: {r.note}" if r.kind == "test" and r.note else r.subject  # the failure's reason
    return (f"| {verdict} | `{md_cell(short_test(s.tests[0]))}`{more} | {md_cell(what)} | "
            f"{md_cell(r.value)} | {md_cell(r.interval)} | {md_cell(r.limit)} |")


def _runs_line(session: SessionDocument) -> str:
    jobs = [shared.job.runs for shared in unique_jobs(session.tests) if shared.job.runs]
    if not jobs:
        return "**Runs**: none recorded"
    shapes = Counter((len(runs), len(runs[0].get("step_times") or [])) for runs in jobs)
    ranks = {len(runs[0].get("ranks") or []) for runs in jobs}
    text = ", ".join(f"{n} job(s) × {r} run(s) × {s} steps" for (r, s), n in sorted(shapes.items(), reverse=True))
    world = "/".join(str(w) for w in sorted(ranks))
    return f"**Runs**: {text}; {world} ranks each; A/B comparisons interleaved"


def _noise_line(session: SessionDocument) -> str:
    """Run-to-run variation of each job's step time (its figure) and the other load on the host during the runs."""
    spreads, loads = [], []
    jobs = [shared.job for shared in unique_jobs(session.tests)]
    for job in jobs:
        loads += [float(r["host_other_load_cores"]) for r in job.runs if r.get("host_other_load_cores") is not None]
        if job.figures.run_cv is not None and job.figures.runs > 1:
            spreads.append(job.figures.run_cv)
    host_bound = [job.figures for job in jobs if job.figures.host_bound]
    parts = []
    if spreads:
        parts.append(f"step-time run-to-run variation {min(spreads):.1%}–{max(spreads):.1%} "
                     f"(median {statistics.median(spreads):.1%}) over {len(spreads)} job(s)")
    if host_bound:  # where wall time holds the host's noise, the work figures are what decides
        shares = [f.gpu_busy_share for f in host_bound if f.gpu_busy_share is not None]
        parts.append(f"{len(host_bound)} job(s) host-bound (GPU busy {min(shares):.0%}–{max(shares):.0%} of the "
                     f"step): their GPU kernel time and counts decide where wall time cannot")
    if loads:
        parts.append(f"other load on the host up to {max(loads):.2f} cores")
    return "**Noise**: " + ("; ".join(parts) if parts else "not measured in this session")


def _machine_line(session: SessionDocument) -> str:
    classes = sorted({t.machine_class for t in session.tests if t.machine_class})
    env = session.environment
    versions = ", ".join(f"{k} {env[k]}" for k in ("torch", "deepspeed", "cuda", "nccl") if env.get(k))
    commit = fingerprint.commit_text(env) if env.get("git_commit") else ""
    return (f"**Machine class**: {', '.join(f'`{c}`' for c in classes) or '–'}"
            + (f" · {versions}" if versions else "") + (f" · commit `{commit}`" if commit else ""))


def _link_line(html_url: str | None, html_path: str | None) -> str:
    if html_url:
        return f"**Report**: [plots and per-rank detail (HTML)]({html_url})"
    if html_path:
        return f"**Report**: `{os.path.basename(html_path)}` (HTML, in this run's artifacts)"
    return "**Report**: no HTML report written (`--distperf-html PATH`)"


def render_pr_comment(doc: Mapping[str, Any], html_url: str | None = None, html_path: str | None = None) -> str:
    """The comment's Markdown for a JSON report's document; `html_url` defaults to $DISTPERF_HTML_URL."""
    from pytest_distperf.report.undecided import STRICT_HINT, subject, undecided, undecided_text

    session = SessionDocument.from_json(doc)
    html_url = html_url or os.environ.get(HTML_URL_ENV) or None
    rows = sorted(shared_rows(verdict_rows(session.tests)), key=lambda s: rank(s.row.outcome))
    listed = [s for s in rows if s.row.outcome in LISTED or s.row.fails]
    head = [MARKER, _counts_line(rows, session), ""]
    tail = ["", _runs_line(session), _noise_line(session), _machine_line(session), _link_line(html_url, html_path)]
    if listed:
        table = ["| verdict | test | what | change | interval (level) | limit |", "|---|---|---|---|---|---|",
                 *map(_listed_row, listed)]
    else:
        table = ["No failing, inconclusive or improved metric."]
    table += _explained_lines(session)
    late = markdown_lines(session.tests)
    if late:  # the tests the session budget left unmeasured, each with its reason (listed, never cut)
        table += [""] + late
    found = undecided(session.tests)
    if found:  # estimate, why undecided, the noise: never mistaken for a pass (listed, never cut)
        table += ["", f"**⚠ {len(found)} undecided** (not failing; {STRICT_HINT}):"]
        table += [f"- `{md_cell(short_test(n))}` {md_cell(subject(r))}: {md_cell(undecided_text(r))}" for n, r in found]
    xfails = [s for s in rows if s.row.outcome == "xfail"]
    room = MAX_LINES - len(head) - len(table) - len(tail)
    if xfails and room >= 2:  # known gaps, by name, when the budget has room (a blank line ends a table)
        names = ", ".join(f"`{short_test(s.tests[0])}`" for s in xfails)
        table += ["", f"Known gaps (strict xfail, not failing): {len(xfails)} — {names}"]
        room -= 2
    lines = head + table + tail
    if room < 0:
        lines[len(head) + len(table):len(head) + len(table)] = [
            "", f"_All {len(listed)} failing/inconclusive/improved rows are listed (never cut): "
                f"this comment is longer than its usual {MAX_LINES} lines._"]
    return "\n".join(lines) + "\n"


def _explained_lines(session: SessionDocument) -> list[str]:
    """What changed in each job with a failing verdict, a line a job: the top three rows that stand out of the one
    ranking the terminal and the reports show (figures/explain.py: `Explanation.short`), each with its share."""
    found: dict[str, Explanation] = {}
    for t in session.tests:
        for v in t.verdicts:
            if v.fails and v.explanation and v.job not in found:
                found[v.job] = Explanation.from_json(v.explanation)
    if not found:
        return []
    return [""] + [f"What changed in {md_cell(job)}: {md_cell(e.short())}" for job, e in found.items()]


def write_pr_comment(path: str, doc: Mapping[str, Any], html_url: str | None = None,
                     html_path: str | None = None) -> None:
    from pytest_distperf.store.redact import redact_text

    write_text_atomic(path, redact_text(render_pr_comment(doc, html_url, html_path)))  # a URL from $DISTPERF_HTML_URL
