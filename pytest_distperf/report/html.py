"""The session's HTML report (`--distperf-html PATH`) and the history trend page: one self-contained file each.

Drawn from the `--distperf-json` document (and the files it points to: the probe phase's Chrome traces and
the baseline files); nothing is measured or decided here. The charts are inline SVG (report/svg.py says why),
the styles one inline <style>; the file needs no network. Sections carry ids and charts carry classes, so the
browser test can check that each one rendered:

  #summary      counts, machine class, commit
  #verdicts     every ratio check, probe check and baseline verdict: outcome, value, interval, limit
  #comparisons  per ratio check, each run's step times (or peak memory) of A and B, the ratio, interval, limit
  #jobs         per job, step time per rank (the slowest rank is the step time) and memory per rank
  #probes       per probed job, collectives per step by kind and size, one step's compute/communication timeline
  #baselines    per baseline verdict, baseline vs current runs, the change with its interval, the trend if given
  #environment  environment, machine class, measured noise (host load, run-to-run spread), invocation

Field names are read tolerantly (`outcome` / `verdict` / `status` / `passed`), since the document's verdict
records may grow new fields; a section with nothing to show says so instead of vanishing.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from pytest_distperf.errors import DistPerfError
from pytest_distperf.measure.units import fmt_bytes, fmt_seconds, fmt_value
from pytest_distperf.report.wording import WIDE, is_words, pair_to_pair, record_bound_text
from pytest_distperf.report.svg import (COMM_COLOUR, COMPUTE_COLOUR, MUTED, OVERLAP_COLOUR, RANK_COLOURS,
                                        SIDE_COLOURS, SVG_CSS, Chart, esc, legend, nice_ticks, padded)

# -- outcomes --------------------------------------------------------------------------------------------------
# One visual family per outcome: a colour, a symbol and a background pattern (the CSS), so a verdict reads in
# greyscale and for colour-blind readers too.
OUTCOME_STYLE: dict[str, tuple[str, str]] = {  # outcome -> (css class, symbol), most urgent first
    "fail": ("v-fail", "✗"),
    "error": ("v-fail", "✗"),
    "xpass": ("v-fail", "!"),
    "inconclusive": ("v-inconclusive", "?"),
    "warn": ("v-inconclusive", "~"),
    "improved": ("v-improved", "★"),
    "xfail": ("v-xfail", "⊘"),
    "pass": ("v-pass", "✓"),
    "new": ("v-neutral", "○"),
    "not comparable": ("v-neutral", "≠"),
    "skipped": ("v-neutral", "–"),
}
_OUTCOME_ALIASES = {"passed": "pass", "failed": "fail", "xfailed": "xfail", "xpassed": "xpass",
                    "undecided": "inconclusive", "unknown": "inconclusive", "regression": "fail"}


def outcome_of(record: Mapping[str, Any]) -> str:
    """A check's or verdict's outcome as the document says it (newer `outcome`/`verdict`, else `status`,
    else the `passed` flag of a ratio check)."""
    for key in ("outcome", "verdict", "status"):
        value = record.get(key)
        if isinstance(value, str) and value:
            return _OUTCOME_ALIASES.get(value.lower(), value.lower())
    if "passed" in record:
        return "pass" if record["passed"] else "fail"
    return "unknown"


def test_outcome(test: Mapping[str, Any]) -> str:
    """pass / fail / xfail / xpass / skipped / error of one test."""
    raw = str(test.get("outcome") or "")
    if any(test.get(k) is not None for k in ("xfail_reason", "wasxfail")) or test.get("xfail"):
        return "xpass" if raw == "passed" else "xfail"
    return _OUTCOME_ALIASES.get(raw, raw or "unknown")


def _severity(item: tuple[str, Any]) -> int:
    """Order of outcomes when counted: what needs a look first."""
    return list(OUTCOME_STYLE).index(item[0]) if item[0] in OUTCOME_STYLE else len(OUTCOME_STYLE)


def badge(outcome: str, text: str | None = None) -> str:
    cls, symbol = OUTCOME_STYLE.get(outcome, ("v-neutral", "·"))
    return (f'<span class="badge {cls}" data-outcome="{esc(outcome)}">'
            f'<span class="sym" aria-hidden="true">{symbol}</span> {esc(text or outcome)}</span>')


# -- data handed in by the history store (issue 19's trend pages) -----------------------------------------------
@dataclass
class TrendPoint:
    commit: str
    time: str  # ISO 8601
    value: float
    low: float | None = None  # optional spread of this session's runs (drawn as a whisker)
    high: float | None = None


@dataclass
class ChangePoint:
    index: int  # the first point after the change
    commit_before: str  # last commit of the old level
    commit_after: str  # first commit of the new level
    before: float | None = None  # level before / after (as the change-point method reports them)
    after: float | None = None
    note: str = ""


@dataclass
class TrendSeries:
    machine_class: str
    test: str
    job: str
    metric: str
    unit: str  # "s", "bytes", "calls", ...
    points: list[TrendPoint]
    change_points: list[ChangePoint] = field(default_factory=list)
    direction: str = "lower"  # which way is better

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.test, self.job, self.metric)


# -- formatting ------------------------------------------------------------------------------------------------
def fmt_unit(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "rel":
        return f"{value:.1e}"
    return fmt_value(value, unit)


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v:+.1%}"


def _short(nodeid: str) -> str:
    return nodeid.split("::", 1)[-1]


def has_interval(record: Mapping[str, Any]) -> bool:
    """An interval was computed (an end may be None: unbounded); exact checks and counts have none."""
    if record.get("method") == "exact" or record.get("metric_kind") == "count":
        return False
    return record.get("low") is not None or record.get("high") is not None or record.get("level") is not None


def interval_text(record: Mapping[str, Any], delta: bool = False) -> str:
    """'[0.73, 1.63] (98%)' of a check's ratio, '[+2.0%, +20.0%] (95%)' of a verdict's change; '–' without one."""
    if not has_interval(record):
        return "–"
    text = record_bound_text(record)  # the words every report uses where the design cannot bound it
    if is_words(text) or text == "-":
        return text if text != "-" else "–"
    level = record.get("level")
    return text + (f" ({level:.0%})" if level else "")


def chart_ends(record: Mapping[str, Any]) -> tuple[Any, Any]:
    """The interval's ends for a chart; an end beyond 10x (or below 1/10 of) the estimate is drawn as unbounded,
    off the axis (wording.WIDE), so an end of 1e6 does not squash the axis."""
    low, high = record.get("low"), record.get("high")
    if not has_interval(record) or not is_words(record_bound_text(record)):
        return low, high
    delta = "delta" in record and "pairs" not in record  # a baseline verdict: ends as changes
    value = float(record.get("delta") or 0.0) + 1.0 if delta else float(record.get("ratio") or 0.0)
    shift = 1.0 if delta else 0.0
    wide = WIDE
    low = None if low is None or not value > 0 or low + shift < value / wide or low + shift <= 0 else low
    high = None if high is None or not value > 0 or high + shift > value * wide else high
    return low, high


def level_text(record: Mapping[str, Any]) -> str:
    level = record.get("level")
    return f"{level:.0%} interval" if level else "interval"


def run_to_run(verdict: Mapping[str, Any]) -> float | None:
    """A verdict's current run-to-run variation, relative (newer records say it; older gave an sd)."""
    if verdict.get("current_cv") is not None:
        return float(verdict["current_cv"])
    if verdict.get("current_spread") is not None and verdict.get("current"):
        return float(verdict["current_spread"]) / float(verdict["current"])
    return None


def _axis(unit: str, lo: float, hi: float, count: int = 5) -> tuple[Callable[[float], str], str, list[float]]:
    """Tick formatter, the axis title's unit and round ticks (round in the shown unit) for values in [lo, hi]."""
    scale, name = 1.0, unit
    if unit == "s":
        scale, name = next(((s, n) for s, n in ((1.0, "s"), (1e-3, "ms")) if max(abs(lo), abs(hi)) >= s),
                           (1e-6, "µs"))
    elif unit == "bytes":
        scale, name = next(((s, n) for s, n in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))
                            if max(abs(lo), abs(hi)) >= s), (1, "B"))
    ticks = [t * scale for t in nice_ticks(lo / scale, hi / scale, count)]
    return (lambda v: f"{v / scale:.4g}"), name, ticks


# -- the document ----------------------------------------------------------------------------------------------
def _tests(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(doc.get("tests") or [])


def _checks(test: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(test.get("checks") or [])


def _verdicts(test: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(test.get("verdicts") or test.get("baseline_verdicts") or [])


def _jobs(test: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(test.get("jobs") or [])


def _job_by_label(test: Mapping[str, Any], label: str) -> dict[str, Any] | None:
    return next((j for j in _jobs(test) if j.get("label") == label), None)


def _run_steps(run: Mapping[str, Any]) -> list[float]:
    return [float(t) for t in run.get("step_times") or []]


def _job_key(job: Mapping[str, Any]) -> tuple[Any, ...]:
    """A job's identity across tests: tests that share a comparison's runs carry the same job."""
    return (job.get("label"), job.get("config_hash"), tuple(tuple(_run_steps(r)) for r in job.get("runs") or []))


@dataclass
class JobView:
    job: dict[str, Any]
    tests: list[str]  # node ids that carry these runs


def unique_jobs(doc: Mapping[str, Any]) -> list[JobView]:
    """Each job's runs once. Tests that share a comparison carry its runs as they were when each test ended:
    a comparison that grew later (more interleaved pairs) holds the earlier runs as its first ones, so a job
    whose runs begin another's is that job, shown with all its runs."""
    seen: dict[tuple[Any, ...], JobView] = {}
    for t in _tests(doc):
        for job in _jobs(t):
            key = _job_key(job)
            if key in seen:
                seen[key].tests.append(t["nodeid"])
            else:
                seen[key] = JobView(job, [t["nodeid"]])
    first_seen = {id(v): i for i, v in enumerate(seen.values())}
    kept: list[tuple[int, JobView]] = []  # (where it first appeared, the view with the most runs)
    for view in sorted(seen.values(), key=lambda v: -len(v.job.get("runs") or [])):
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


def _probe_records(doc: Mapping[str, Any]) -> list[tuple[dict[str, Any], list[str]]]:
    """Probe records, each once (tests that share a probed job carry the same record)."""
    seen: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for t in _tests(doc):
        for p in t.get("probes") or []:
            key = json.dumps([p.get("label"), p.get("traces"), p.get("metrics")], sort_keys=True, default=str)
            if key in seen:
                seen[key][1].append(t["nodeid"])
            else:
                seen[key] = (p, [t["nodeid"]])
    return list(seen.values())


# -- the probe trace: one step's compute and communication -----------------------------------------------------
Interval = tuple[float, float]


@dataclass
class StepTimeline:
    """One profiled step of one rank, from its Chrome trace: when compute and communication ran (µs from
    the step's start)."""

    rank: int | None
    source: str  # what the lanes are: "GPU kernels" or "CPU ops"
    step: int  # which profiled step (0-based) of `steps`
    steps: int
    length: float  # µs, the step's range
    compute: list[Interval]
    comm: list[tuple[float, float, str]]  # (start, end, name)


def _merge(intervals: Iterable[Interval], gap: float) -> list[Interval]:
    """Sorted, disjoint intervals; gaps shorter than `gap` closed (a pixel's worth: the chart cannot show them)."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if e < s:
            continue
        if out and s <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _is_comm_name(name: str) -> bool:
    from pytest_distperf.probes.comms import COLLECTIVE_OPS

    return name.startswith(("gloo:", "nccl:", "nccl")) or name in COLLECTIVE_OPS


def step_timeline(path: str, rank: int | None = None) -> StepTimeline:
    """The middle profiled step of a probe trace. On CUDA the lanes are GPU kernels (NCCL vs the rest, as the
    overlap probe reads them); on CPU they are the profiler's ops: the collectives' own ranges (gloo runs them
    on its worker threads) against the ops of the thread that runs the step."""
    from pytest_distperf.probes import STEP_MARK
    from pytest_distperf.probes.trace import KERNEL_CAT, Trace, is_comm_kernel, load

    trace = Trace(load(path))
    if not trace.steps:
        raise ValueError(f"{path}: no '{STEP_MARK}' range in the trace")
    step = len(trace.steps) // 2
    start, end = trace.steps[step]
    compute: list[Interval] = []
    comm: list[tuple[float, float, str]] = []
    kernels = trace.of_cat(KERNEL_CAT)
    if kernels:
        source = "GPU kernels"
        for e in kernels:
            if trace.gpu_step(e) != step:
                continue
            s, f = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))
            if is_comm_kernel(e.get("name", "")):
                comm.append((s, f, e["name"].split("(")[0]))
            else:
                compute.append((s, f))
        spans = [s for s, _ in compute] + [s for s, _, _ in comm]
        ends = [f for _, f in compute] + [f for _, f, _ in comm]
        start, end = min([start, *spans]), max([end, *ends])
    else:
        source = "CPU ops"
        step_threads = {e.get("tid") for e in trace.events
                        if e.get("cat") == "user_annotation" and e.get("name") == STEP_MARK}
        inside = [e for e in trace.events if start <= float(e["ts"]) <= end and e.get("cat") in ("cpu_op",
                                                                                                 "user_annotation")]
        comm_events = [e for e in inside if _is_comm_name(e.get("name", ""))]
        # gloo's ranges on its worker threads are the transfers; the c10d op on the step's thread is the call
        # that issues them (and waits, when the collective is synchronous).
        worker = [e for e in comm_events if e.get("name", "").startswith("gloo:")]
        for e in worker or comm_events:
            comm.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)), e["name"]))
        issued = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
                  for e in comm_events if e.get("tid") in step_threads]
        for e in inside:
            if e.get("cat") != "cpu_op" or e.get("tid") not in step_threads or _is_comm_name(e.get("name", "")):
                continue
            s, f = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))
            if any(s <= a and b <= f for a, b in issued):  # an op around a collective call: not compute
                continue
            compute.append((s, f))
    gap = (end - start) / 700
    return StepTimeline(rank=rank, source=source, step=step, steps=len(trace.steps), length=end - start,
                        compute=[(s - start, e - start) for s, e in _merge(compute, gap)],
                        comm=[(s - start, e - start, n) for s, e, n in sorted(comm)])


def _intersect(a: list[Interval], b: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


# -- charts ----------------------------------------------------------------------------------------------------
WIDTH = 900  # px of every chart; the page is at most 1240 wide


def _label_room(labels: Iterable[str]) -> int:
    """Left margin for row labels (11 px text), at most 190 px."""
    return int(min(190, 16 + 6.3 * max((len(x) for x in labels), default=4)))


def strip_chart(rows: Sequence[tuple[str, list[float], str, str]], unit: str, label: str, css: str,
                width: int = WIDTH, notes: Mapping[int, tuple[str, bool]] | None = None) -> str:
    """One row per series: (row label, values, colour, marker 'circle'|'square'); each value a dot (spread a
    little within the row, in order), the row's median a bar. `notes`: row index -> (text at its right, loud)."""
    row_h = 22
    values = [v for _, vs, _, _ in rows for v in vs]
    lo, hi = padded(values)
    fmt, unit_name, ticks = _axis(unit, lo, hi, 8)
    c = Chart(width, 20 + row_h * len(rows) + 34, label, css, left=_label_room(r[0] for r in rows),
              right=130 if notes else 20, top=10)
    x = c.x_scale((lo, hi))
    c.x_axis(x, fmt, unit_name, ticks)
    for i, (name, vs, colour, marker) in enumerate(rows):
        yc = c.y0 + 10 + i * row_h + row_h / 2
        c.text(c.x0 - 8, yc + 4, name, "row-lbl", "end")
        # One group per row carries the class and colours; each point keeps only its place and hover text.
        square = marker == "square"
        c.add(f'<g class="pts {"pt-b" if square else "pt-a"}" '
              + (f'fill="none" stroke="{colour}" stroke-width="1.2">' if square else f'fill="{colour}">'))
        for k, v in enumerate(vs):
            y = yc + ((k % 5) - 2) * 2.2  # spread in y, so equal values stay visible
            title = f"<title>{esc(name)} #{k + 1}: {esc(fmt_unit(v, unit))}</title>"
            if square:
                c.add(f'<rect x="{x(v) - 3.2:.1f}" y="{y - 3.2:.1f}" width="6.4" height="6.4">{title}</rect>')
            else:
                c.add(f'<circle cx="{x(v):.1f}" cy="{y:.1f}" r="3.2">{title}</circle>')
        c.add("</g>")
        if vs:
            med = statistics.median(vs)
            c.line(x(med), yc - 9, x(med), yc + 9, "#24292f", "median", 2.5,
                   title=f"{name}: median {fmt_unit(med, unit)}")
        if notes and i in notes:
            text, loud = notes[i]
            c.text(c.x1 + 8, yc + 4, text, "straggler" if loud else "row-note", fill="#a40e26" if loud else MUTED,
                   size=11, weight="bold" if loud else "")
    return c.render()


def interval_chart(value: float, low: float | None, high: float | None, limit: float | None, direction: str,
                   label: str, css: str, outcome: str, width: int = WIDTH, value_name: str = "A/B",
                   fmt: Callable[[float], str] = lambda v: f"{v:.3g}", ref: float | None = None,
                   band: tuple[float, float] | None = None, interval: str | None = None) -> str:
    """A point with its interval on one axis (`interval`: its text, e.g. '98% interval'; None: no interval; an
    end that is None is unbounded and runs off the axis), the limit as a dashed line and the side beyond it hatched.
    `direction`: 'at_most' (beyond = above the limit), 'at_least' or 'above' (beyond = below it). `ref`: a
    reference line (1.0 or 0 %). `band`: a tolerated region in light grey (baseline checks: ± threshold)."""
    lo, hi = padded([value, *(v for v in (low, high, limit, ref) if v is not None), *(band or ())], pad=0.12)
    c = Chart(width, 78, label, css, left=170, right=20, top=24, bottom=26)
    x = c.x_scale((lo, hi))
    c.x_axis(x, fmt, "", nice_ticks(lo, hi, 8))
    mid = (c.y0 + c.y1) / 2
    ends = ("unbounded" if low is None else fmt(low), "unbounded" if high is None else fmt(high))
    text = f"{value_name} {fmt(value)}" + (f", {interval} [{ends[0]}, {ends[1]}]" if interval else ", no interval") + \
        (f"; limit {_LIMIT_SIGN.get(direction, '≤')} {fmt(limit)}" if limit is not None else "")
    c.text(c.x0, 14, text, "chart-title", size=12, weight="600")
    if band is not None:
        c.rect(x(band[0]), c.y0, x(band[1]) - x(band[0]), c.y1 - c.y0, "#eaeef2", "band",
               f"tolerated: {fmt(band[0])} .. {fmt(band[1])}")
    if limit is not None:
        beyond_lo, beyond_hi = (limit, hi) if direction == "at_most" else (lo, limit)
        c.rect(x(beyond_lo), c.y0, x(beyond_hi) - x(beyond_lo), c.y1 - c.y0, "url(#hatch)", "beyond",
               f"beyond the limit {fmt(limit)}")
        c.line(x(limit), c.y0 - 2, x(limit), c.y1, "#cf222e", "limit", 2, "5 3", f"limit {fmt(limit)}")
        c.text(c.x0 - 8, mid + 4, "limit ┆ estimate ◆", "row-lbl", "end", MUTED, 10)
    if ref is not None:
        c.line(x(ref), c.y0, x(ref), c.y1, "#8c959f", "ref", 1, "2 2", f"no difference ({fmt(ref)})")
    if interval:
        x_lo, x_hi = x(low) if low is not None else c.x0, x(high) if high is not None else c.x1
        c.line(x_lo, mid, x_hi, mid, "#24292f", "ci", 2, title=f"{interval} {ends[0]} .. {ends[1]}")
        for v, xe in ((low, x_lo), (high, x_hi)):
            if v is not None:
                c.line(xe, mid - 6, xe, mid + 6, "#24292f", "ci-cap", 2)
            else:  # unbounded: an arrow head at the frame
                step = 6 if xe >= c.x1 else -6
                c.add(f'<path class="ci-open" d="M{xe - step:.1f},{mid - 5:.1f} L{xe:.1f},{mid:.1f} '
                      f'L{xe - step:.1f},{mid + 5:.1f}" fill="none" stroke="#24292f" stroke-width="2"/>')
    colour = {"pass": "#1a7f37", "fail": "#cf222e", "xfail": "#8250df", "improved": "#0969da"}.get(outcome, "#9a6700")
    c.add(f'<path class="estimate" d="M{x(value):.1f},{mid - 7:.1f} l7,7 l-7,7 l-7,-7 z" fill="{colour}" '
          f'stroke="#24292f"><title>{esc(value_name)} {esc(fmt(value))}</title></path>')
    return c.render()


_LIMIT_SIGN = {"at_most": "≤", "at_least": "≥", "above": ">"}


def bar_chart(rows: Sequence[tuple[str, float, str, str]], unit: str, label: str, css: str,
              width: int = WIDTH) -> str:
    """Horizontal bars: (row label, value, colour, hover text)."""
    row_h = 20
    values = [v for _, v, _, _ in rows]
    hi = max(values + [0.0]) * 1.08 or 1.0
    fmt, unit_name, ticks = _axis(unit, 0, hi, 6)
    c = Chart(width, 16 + row_h * len(rows) + 32, label, css, left=_label_room(r[0] for r in rows), right=80, top=8)
    x = c.x_scale((0, hi))
    c.x_axis(x, fmt, unit_name, ticks)
    for i, (name, v, colour, title) in enumerate(rows):
        y = c.y0 + 8 + i * row_h
        c.text(c.x0 - 8, y + 12, name, "row-lbl", "end")
        c.rect(x(0), y + 2, x(v) - x(0), row_h - 6, colour, "bar", title or f"{name}: {fmt_unit(v, unit)}")
        c.text(x(v) + 4, y + 12, fmt_unit(v, unit), "val-lbl")
    return c.render()


def timeline_chart(timelines: Sequence[StepTimeline], label: str, width: int = WIDTH) -> str:
    """Per rank three lanes over one step: compute, communication, and where both ran (overlap)."""
    lane_h, gap = 14, 10
    length = max((t.length for t in timelines), default=1.0) or 1.0
    c = Chart(width, 12 + len(timelines) * (3 * lane_h + gap) + 30, label, "timeline", left=170, right=16, top=8)
    x = c.x_scale((0.0, length))
    c.x_axis(x, lambda v: f"{v / 1e3:.4g}", "ms from the step's start", nice_ticks(0.0, length, 10))
    for i, t in enumerate(timelines):
        y = c.y0 + 4 + i * (3 * lane_h + gap)
        who = f"rank {t.rank}" if t.rank is not None else "rank ?"
        comm_iv = _merge(((s, e) for s, e, _ in t.comm), 0.0)
        both = _intersect(t.compute, comm_iv)
        lanes = (("compute", COMPUTE_COLOUR, "seg-compute"), ("communication", COMM_COLOUR, "seg-comm"),
                 ("overlap", OVERLAP_COLOUR, "seg-overlap"))
        for k, (name, _, _) in enumerate(lanes):
            c.text(c.x0 - 6, y + k * lane_h + 10, f"{who} {name}" if k == 0 else name, "row-lbl", "end", size=10)
            c.rect(x(0), y + k * lane_h + 1, x(length) - x(0), lane_h - 2, "#f6f8fa", "lane")
        for s, e in t.compute:
            c.rect(x(s), y + 1, max(x(e) - x(s), 0.6), lane_h - 2, COMPUTE_COLOUR, "seg-compute")
        for s, e, name in t.comm:
            c.rect(x(s), y + lane_h + 1, max(x(e) - x(s), 0.6), lane_h - 2, COMM_COLOUR, "seg-comm",
                   f"{name}: {(e - s) / 1e3:.3g} ms at {s / 1e3:.3g} ms")
        for s, e in both:
            c.rect(x(s), y + 2 * lane_h + 1, max(x(e) - x(s), 0.6), lane_h - 2, OVERLAP_COLOUR, "seg-overlap")
    return c.render()


def trend_chart(series: TrendSeries, width: int = WIDTH) -> str:
    """A metric over sessions (x = session order, labelled by commit), change points as vertical lines with
    their commit range and the levels either side."""
    pts = series.points
    values = [p.value for p in pts] + [v for p in pts for v in (p.low, p.high) if v is not None]
    lo, hi = padded(values, pad=0.1)
    fmt, unit_name, ticks = _axis(series.unit, lo, hi, 5)
    c = Chart(width, 220, f"{series.metric} of {series.job} over {len(pts)} sessions", "trend", left=64, right=16,
              top=22, bottom=46)
    x = c.x_scale((-0.5, max(len(pts) - 0.5, 0.5)))
    y = c.y_scale((lo, hi))
    c.y_axis(y, fmt, unit_name, ticks)
    c.line(c.x0, c.y1, c.x1, c.y1, "#8c959f", "axis")
    step = max(1, len(pts) // 12)
    for i in range(0, len(pts), step):
        c.text(x(i), c.y1 + 14, pts[i].commit[:7], "tick-lbl", "middle", size=9)
    c.text((c.x0 + c.x1) / 2, c.height - 4, "sessions, oldest first (commit)", "axis-title", "middle")
    for i, p in enumerate(pts):
        if p.low is not None and p.high is not None:
            c.line(x(i), y(p.low), x(i), y(p.high), "#8c959f", "whisker", 1)
    c.polyline([(x(i), y(p.value)) for i, p in enumerate(pts)], SIDE_COLOURS[0], "trend-line")
    for i, p in enumerate(pts):
        c.circle(x(i), y(p.value), 3, SIDE_COLOURS[0], "trend-pt",
                 f"{p.commit[:12]} {p.time}: {fmt_unit(p.value, series.unit)}")
    bounds = [0] + [cp.index for cp in series.change_points] + [len(pts)]
    for cp in series.change_points:
        xc = x(cp.index - 0.5)
        c.line(xc, c.y0 - 8, xc, c.y1, "#cf222e", "change-point", 2, "6 3",
               f"change point between {cp.commit_before[:12]} and {cp.commit_after[:12]}")
        change = ""
        if cp.before and cp.after is not None:
            change = f" {cp.after / cp.before - 1:+.1%}"
        c.text(xc + 4, c.y0 - 10 + 8, f"{cp.commit_before[:7]}..{cp.commit_after[:7]}{change}", "cp-lbl",
               fill="#a40e26", size=10, weight="bold")
    for k, cp in enumerate(series.change_points):  # the levels either side, as the method reported them
        for level, a, b in ((cp.before, bounds[k], cp.index), (cp.after, cp.index, bounds[k + 2])):
            if level is not None:
                c.line(x(a - 0.4), y(level), x(b - 0.6), y(level), "#cf222e", "level", 1.5)
    return c.render()


# -- sections --------------------------------------------------------------------------------------------------
def _section(sid: str, title: str, body: str, note: str = "") -> str:
    n = f'<p class="note">{note}</p>' if note else ""
    return f'<section id="{sid}"><h2>{esc(title)}</h2>{n}{body}</section>'


def _empty(text: str) -> str:
    return f'<p class="empty">{esc(text)}</p>'


def _table(header: Sequence[str] | None, rows: Sequence[Sequence[str]], css: str = "",
           row_attrs: Sequence[str] | None = None) -> str:
    """Cells are HTML already (escape text before); no header row when `header` is None; `row_attrs`: each
    row's attributes (HTML)."""
    head = "<thead><tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr></thead>" if header else ""
    attrs = list(row_attrs) if row_attrs is not None else [""] * len(rows)
    body = "".join(f"<tr{a}>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row, a in zip(rows, attrs))
    return f'<table class="{css}">{head}<tbody>{body}</tbody></table>'


def _kv(items: Mapping[str, Any]) -> str:
    rows = [[esc(k), f"<code>{esc('–' if v is None else v)}</code>"] for k, v in sorted(items.items())]
    return _table(None, rows, "kv")


def _summary(doc: Mapping[str, Any]) -> str:
    tests = _tests(doc)
    counts: dict[str, int] = {}
    for t in tests:
        o = test_outcome(t)
        counts[o] = counts.get(o, 0) + 1
    rows_outcomes = " ".join(badge(o, f"{n} {o}") for o, n in sorted(counts.items(), key=_severity))
    vcounts: dict[str, int] = {}
    for shared in shared_rows(verdict_rows(doc)):
        if shared.row.kind != "test":
            vcounts[shared.row.outcome] = vcounts.get(shared.row.outcome, 0) + 1
    verdicts = " ".join(badge(o, f"{n} {o}") for o, n in sorted(vcounts.items(), key=_severity)) or "none"
    env = doc.get("environment") or {}
    classes = sorted({t.get("machine_class") for t in tests} - {None})
    items = [("tests", f"{len(tests)}: {rows_outcomes}"), ("checks and verdicts", verdicts),
             ("machine class", ", ".join(f"<code>{esc(c)}</code>" for c in classes) or "–"),
             ("commit", f"<code>{esc((env.get('git_commit') or '–')[:12])}</code>"),
             ("written", esc(doc.get("created_at") or "–"))]
    return "<dl class='summary'>" + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in items) + "</dl>"


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

    def badge(self) -> str:
        return badge("fail", f"{self.outcome}, fails the test") if self.fails else badge(self.outcome)


def _check_row(test: Mapping[str, Any], c: Mapping[str, Any], xfailed: bool) -> VerdictRow:
    outcome = outcome_of(c)
    note = ""
    if xfailed and outcome == "fail":
        outcome, note = "xfail", "a declared known gap (strict xfail)"
    unit = c.get("unit", "")
    probe = bool(c.get("direction"))
    absolute = probe and c.get("b") == "limit"
    if unit == "rel":
        value, limit = f"{c['ratio']:.1e}", f"≤ {c['threshold']:.0e}"
    elif absolute:
        value = fmt_unit(c["ratio"], unit)
        limit = f"{_LIMIT_SIGN.get(c.get('direction') or 'at_most', '≤')} {fmt_unit(c['threshold'], unit)}"
    else:
        value = f"{c['ratio']:.3f}×"
        limit = f"{_LIMIT_SIGN.get(c.get('direction') or 'at_most', '≤')} {c['threshold']:g}×"
    interval = interval_text(c)
    if c.get("method") == "paired":  # the noise the interval is made of, shown next to it
        noise = f"{c.get('pairs')} pairs, pair-to-pair {pair_to_pair(c)}"
        note = f"{note}; {noise}" if note else noise
    subject = f"{c.get('name')}: {c.get('a')}" + ("" if absolute else f" vs {c.get('b')}")
    return VerdictRow(test["nodeid"], "probe" if probe else "ratio", subject, value, interval, limit, outcome, note)


def _verdict_row(test: Mapping[str, Any], v: Mapping[str, Any], xfailed: bool) -> VerdictRow:
    outcome = outcome_of(v)
    note = v.get("note") or ""
    fails = bool(v.get("fails")) and outcome != "fail"  # e.g. 'new' under --distperf-require-baseline
    if xfailed and outcome == "fail":
        outcome = "xfail"
    interval = interval_text(v, delta=True)
    limit = f"± {v['threshold']:.1%}" if v.get("threshold") is not None else "–"
    value = (f"{_pct(v.get('delta'))} ({fmt_unit(v.get('baseline'), v.get('unit', ''))} → "
             f"{fmt_unit(v.get('current'), v.get('unit', ''))})")
    subject = f"{v.get('metric')} of {v.get('job')}"
    if v.get("reference"):  # head vs base (gate/against.py): both commits named
        subject = f"{subject}, {v['reference']}"
        value = value.replace(" → ", " base → head ")
    return VerdictRow(test["nodeid"], "baseline", subject, value, interval, limit, outcome, note, fails)


def verdict_rows(doc: Mapping[str, Any]) -> list[VerdictRow]:
    """Every check and baseline verdict of every test, plus a row for a test that failed without one."""
    rows: list[VerdictRow] = []
    for t in _tests(doc):
        xfailed = test_outcome(t) == "xfail"
        own = [_check_row(t, c, xfailed) for c in _checks(t)] + [_verdict_row(t, v, xfailed) for v in _verdicts(t)]
        if not own or test_outcome(t) in ("fail", "error") and not any(r.outcome == "fail" for r in own):
            message = (t.get("message") or "").strip().splitlines()
            failure = " ".join((t.get("failure") or "").split())  # the exception's message (session.failure_text)
            own.append(VerdictRow(t["nodeid"], "test", "test outcome", "–", "–", "–", test_outcome(t),
                                  failure[:300] if failure else (message[-1][:200] if message else "")))
        rows += own
    return rows


@dataclass
class SharedRow:
    row: VerdictRow
    tests: list[str]  # every test that carries this row (tests sharing a comparison's runs carry the same)


def shared_rows(rows: Iterable[VerdictRow]) -> list[SharedRow]:
    out: dict[tuple[str, ...], SharedRow] = {}
    for r in rows:
        key = (r.kind, r.subject, r.value, r.interval, r.limit, r.outcome, r.note, r.fails)
        if key in out:
            out[key].tests.append(r.test)
        else:
            out[key] = SharedRow(r, [r.test])
    return list(out.values())


def _test_cell(tests: Sequence[str], outcomes: Mapping[str, str]) -> str:
    first = f"<code>{esc(_short(tests[0]))}</code> {badge(outcomes.get(tests[0], 'unknown'))}"
    if len(tests) == 1:
        return first
    others = ", ".join(_short(t) for t in tests[1:])
    return first + f' <span class="note" title="{esc(others)}">(+{len(tests) - 1} tests)</span>'


_QUIET = ("pass", "new", "not comparable", "skipped")  # verdicts listed in a collapsed table


def _verdict_table(doc: Mapping[str, Any]) -> str:
    rows = shared_rows(verdict_rows(doc))
    if not rows:
        return _empty("No distperf test in this session.")
    outcomes = {t["nodeid"]: test_outcome(t) for t in _tests(doc)}

    def cells(items: Sequence[SharedRow]) -> list[list[str]]:
        return [[_test_cell(s.tests, outcomes), esc(s.row.kind), esc(s.row.subject), esc(s.row.value),
                 esc(s.row.interval), esc(s.row.limit), s.row.badge(),
                 f'<span class="note">{esc(s.row.note)}</span>'] for s in items]

    def attrs(items: Sequence[SharedRow]) -> list[str]:  # what a test of the page matches rows by
        return [f' class="verdict-row" data-kind="{esc(s.row.kind)}" data-outcome="{esc(s.row.outcome)}" '
                f'data-subject="{esc(s.row.subject)}" data-tests="{esc(chr(10).join(s.tests))}"' for s in items]

    header = ["test (outcome)", "kind", "what", "value", "interval (level)", "limit", "verdict", "note"]
    checks = [s for s in rows if s.row.kind != "baseline"]
    loud = [s for s in rows if s.row.kind == "baseline" and (s.row.outcome not in _QUIET or s.row.fails)]
    quiet = [s for s in rows if s.row.kind == "baseline" and s.row.outcome in _QUIET and not s.row.fails]
    out = legend_outcomes()
    out += "<h3>checks</h3>" + (_table(header, cells(checks), "verdicts checks", attrs(checks)) if checks
                                else _empty("no ratio or probe check"))
    out += "<h3>baseline verdicts</h3>"
    if loud:
        out += _table(header, cells(loud), "verdicts baseline", attrs(loud))
    if quiet:
        counts: dict[str, int] = {}
        for s in quiet:
            counts[s.row.outcome] = counts.get(s.row.outcome, 0) + 1
        what = ", ".join(f"{n} {o}" for o, n in sorted(counts.items()))
        out += (f'<details class="quiet"><summary>{"and " if loud else ""}{len(quiet)} more baseline verdict(s): '
                f"{esc(what)} (show)</summary>" + _table(header, cells(quiet), "verdicts baseline-quiet", attrs(quiet))
                + "</details>")
    if not loud and not quiet:
        out += _empty("no baseline verdict")
    return out


def legend_outcomes() -> str:
    shown = ("pass", "fail", "inconclusive", "xfail", "improved", "new")
    return '<p class="legend">' + " ".join(badge(o) for o in shown) + \
           " — symbol, border and pattern tell them apart without colour</p>"


def _comparisons(doc: Mapping[str, Any]) -> str:
    parts: list[str] = []
    for t in _tests(doc):
        xfailed = test_outcome(t) == "xfail"
        for c in _checks(t):
            if c.get("unit") == "rel":
                continue  # loss agreement: a number, in the verdict table
            outcome = _check_row(t, c, xfailed).outcome
            head = (f'<h3><code>{esc(_short(t["nodeid"]))}</code> · {esc(c.get("name"))} {badge(outcome)}</h3>')
            body = ""
            if not c.get("direction"):
                body += _comparison_runs(t, c)
            probe_abs = c.get("direction") and c.get("b") == "limit"
            if probe_abs:
                fmt = (lambda v, u=c.get("unit", ""): fmt_unit(v, u))
                name = c.get("name", "value")
            else:
                fmt, name = (lambda v: f"{v:.3g}×"), "A/B"
            body += interval_chart(float(c["ratio"]), *chart_ends(c), float(c["threshold"]),
                                   c.get("direction") or "at_most", f"{name} against its limit", "ratio", outcome,
                                   value_name=name, fmt=fmt, ref=None if probe_abs else 1.0,
                                   interval=level_text(c) if has_interval(c) else None)
            parts.append(f'<div class="comparison">{head}{body}</div>')
    if not parts:
        return _empty("No ratio check in this session.")
    return "".join(parts)


def _comparison_runs(test: Mapping[str, Any], c: Mapping[str, Any]) -> str:
    a, b = _job_by_label(test, c.get("a", "")), _job_by_label(test, c.get("b", ""))
    if a is None or b is None:
        return _empty("The runs of this comparison are not in the document (no per-job detail for this test).")
    sides = ((f"A {c['a']}", a, SIDE_COLOURS[0], "circle"), (f"B {c['b']}", b, SIDE_COLOURS[1], "square"))
    if c.get("unit") == "s":
        rows: list[tuple[str, list[float], str, str]] = []
        n = max(len(a.get("runs") or []), len(b.get("runs") or []))
        for i in range(n):  # the order they ran in: A B A B ...
            for tag, job, colour, marker in sides:
                runs = job.get("runs") or []
                if i < len(runs):
                    rows.append((f"{tag[0]} run {i + 1}", _run_steps(runs[i]), colour, marker))
        key = legend([("circle", SIDE_COLOURS[0], f"A = {c['a']}"), ("square", SIDE_COLOURS[1], f"B = {c['b']}"),
                      ("bar", "#24292f", "median of the run")])
        return key + strip_chart(rows, "s", f"step times of each run of {c['a']} and {c['b']}", "strip runs")
    bars = []
    for tag, job, colour, _ in sides:
        for i, run in enumerate(job.get("runs") or []):
            if run.get("peak_memory") is not None:
                bars.append((f"{tag[0]} run {i + 1}", float(run["peak_memory"]), colour, f"{tag}: run {i + 1}"))
    key = legend([("bar", SIDE_COLOURS[0], f"A = {c['a']}"), ("bar", SIDE_COLOURS[1], f"B = {c['b']}")])
    return key + bar_chart(bars, "bytes", "peak memory of each run", "bars runs-memory")


def _figures_line(job: Mapping[str, Any], doc: Mapping[str, Any]) -> str:
    """The job's figures as the document states them (measure/figures.py defines each), where it has them."""
    f = job.get("figures") or {}
    if not f:
        return ""
    scopes = doc.get("figures") or {}
    parts = []
    if f.get("step_time") is not None:
        scope = (scopes.get("step_time") or {}).get("scope")
        parts.append(f"step time <b>{esc(fmt_seconds(f['step_time']))}</b>" + (f" ({esc(scope)})" if scope else ""))
    if f.get("run_cv") is not None:
        parts.append(f"run-to-run {f['run_cv']:.1%}")
    if f.get("step_p10") is not None and f.get("step_p90") is not None:
        parts.append(f"p10–p90 {esc(fmt_seconds(f['step_p10']))} – {esc(fmt_seconds(f['step_p90']))}")
    if f.get("peak_memory") is not None:
        parts.append(f"peak memory <b>{esc(fmt_bytes(f['peak_memory']))}</b> ({esc(f.get('memory_kind') or '')})")
    if f.get("tokens_per_s"):
        parts.append(f"{f['tokens_per_s']:,.0f} tokens/s")
    if f.get("optimizer_bytes_per_param") is not None:
        parts.append(f"optimizer state {f['optimizer_bytes_per_param']:.1f} B/param")
    work = f.get("work") or {}
    if "gpu_time" in work:
        parts.append(f"GPU kernel time <b>{esc(fmt_seconds(work['gpu_time']))}</b>/step")
    if f.get("gpu_busy_share") is not None:
        parts.append(f"GPU busy {f['gpu_busy_share']:.0%} of the step")
    for name, what in (("kernels_per_step", "kernels"), ("flops_per_step", "FLOP"), ("aten_ops_per_step", "ops"),
                       ("instructions_per_step", "instructions")):
        if name in work:
            parts.append(f"{work[name]:.4g} {what}/step")
    if "train_memory" in work:
        parts.append(f"training state {esc(fmt_bytes(work['train_memory']))}")
    line = '<p class="figures">' + " · ".join(parts) + "</p>"
    if f.get("time_split"):  # where the runs' wall time went (measure/figures.run_time_split)
        from pytest_distperf.measure.figures import time_split_text

        line += f'<p class="figures">{esc(time_split_text(f["time_split"]))}</p>'
    if f.get("host_bound_text"):
        line += f'<p class="figures"><b>{esc(f["host_bound_text"])}</b></p>'
    return line


def _memory_kind(job: Mapping[str, Any]) -> tuple[str, str]:
    device = (job.get("config") or {}).get("device") or ("cuda" if "cuda" in str(job.get("label")) else "cpu")
    if device == "cuda":
        return "cuda_peak_allocated", "CUDA peak allocated"
    return "host_training_bytes", "host RSS growth during training"


STRAGGLER_MARK = 0.05  # a rank whose median step is this much above the fastest rank's is drawn in red


def _jobs_section(doc: Mapping[str, Any]) -> str:
    parts = []
    for view in unique_jobs(doc):
        job = view.job
        runs = job.get("runs") or []
        if not runs:
            continue
        ranks = sorted({r.get("rank") for run in runs for r in run.get("ranks") or []}, key=lambda v: (v is None, v))
        hosts = {r.get("rank"): r.get("host") for run in runs for r in run.get("ranks") or [] if r.get("host")}
        several_hosts = len(set(hosts.values())) > 1  # on several nodes a rank's row says where it ran
        rows: list[tuple[str, list[float], str, str]] = [
            ("step (slowest rank)", [t for run in runs for t in _run_steps(run)], "#24292f", "circle")]
        medians = []
        for k, rank in enumerate(ranks):
            times = [float(t) for run in runs for r in run.get("ranks") or [] if r.get("rank") == rank
                     for t in r.get("step_times") or []]
            name = f"rank {rank}" + (f" ({hosts.get(rank)})" if several_hosts and hosts.get(rank) else "")
            rows.append((name, times, RANK_COLOURS[k % len(RANK_COLOURS)], "circle"))
            medians.append(statistics.median(times) if times else 0.0)
        notes: dict[int, tuple[str, bool]] = {}
        fastest = min(medians, default=0.0)
        for k, med in enumerate(medians):
            if len(medians) > 1 and fastest > 0:
                behind = med / fastest - 1
                slowest = med == max(medians)
                text = "fastest" if med == fastest else ("slowest " if slowest else "") + f"{behind:+.1%}"
                notes[k + 1] = (text, slowest and behind >= STRAGGLER_MARK)
        tests = ", ".join(f"<code>{esc(_short(n))}</code>" for n in view.tests)
        body = (f'<p class="note">{len(runs)} run(s) × {len(_run_steps(runs[0]))} timed steps · tests: {tests}</p>'
                + _figures_line(job, doc)
                + strip_chart(rows, "s", f"step time per rank of {job.get('label')}", "strip ranks", notes=notes))
        key, what = _memory_kind(job)
        bars = []
        for k, rank in enumerate(ranks):
            vals = [r.get(key) for run in runs for r in run.get("ranks") or [] if r.get("rank") == rank]
            vals = [float(v) for v in vals if v is not None]
            if vals:
                bars.append((f"rank {rank}", max(vals), RANK_COLOURS[k % len(RANK_COLOURS)],
                             f"rank {rank}: {what} {fmt_bytes(max(vals))} (largest of {len(vals)} run(s); "
                             f"each: {', '.join(fmt_bytes(v) for v in vals)})"))
        if bars:
            body += f'<p class="note">memory per rank: {esc(what)}, the largest over the runs</p>'
            body += bar_chart(bars, "bytes", f"memory per rank of {job.get('label')}", "bars memory")
        body += _breakdown(job)
        parts.append(f'<div class="job"><h3>{esc(job.get("label"))}</h3>{body}</div>')
    return "".join(parts) or _empty("No job's per-rank detail in this document.")


def _breakdown(job: Mapping[str, Any]) -> str:
    """Where a step's time goes (forward / backward / optimizer / other), per rank of the first run, as measured
    in the separate breakdown phase."""
    run = (job.get("runs") or [{}])[0]
    ranks = [r for r in run.get("ranks") or [] if r.get("step_breakdown")]
    if not ranks:
        return ""
    phases = sorted({p for r in ranks for p in r["step_breakdown"]} - {"total"},
                    key=lambda p: (["forward", "backward", "optimizer", "other"] + [p]).index(p))
    colours = {"forward": "#0072B2", "backward": "#56B4E9", "optimizer": "#E69F00", "other": "#bbbbbb"}
    total = max(sum(float(r["step_breakdown"].get(p) or 0.0) for p in phases) for r in ranks) or 1.0
    c = Chart(WIDTH, 16 + 20 * len(ranks) + 32, f"step breakdown of {job.get('label')}", "breakdown", left=170,
              right=90, top=8)
    fmt, unit_name, ticks = _axis("s", 0, total * 1.05, 8)
    x = c.x_scale((0, total * 1.05))
    c.x_axis(x, fmt, unit_name, ticks)
    for i, r in enumerate(ranks):
        y = c.y0 + 8 + i * 20
        c.text(c.x0 - 8, y + 12, f"rank {r.get('rank')}", "row-lbl", "end")
        acc = 0.0
        for p in phases:
            v = float(r["step_breakdown"].get(p) or 0.0)
            c.rect(x(acc), y + 2, x(acc + v) - x(acc), 14, colours.get(p, "#999"), f"seg seg-{p}",
                   f"rank {r.get('rank')} {p}: {fmt_seconds(v)}", stroke="#fff")
            acc += v
        c.text(x(acc) + 4, y + 12, fmt_seconds(acc), "val-lbl")
    key = legend([("bar", colours.get(p, "#999"), p) for p in phases])
    return '<p class="note">where a step\'s time goes (separate phase after timing, first run)</p>' + key + c.render()


def _probes_section(doc: Mapping[str, Any], read_timeline: Callable[[str, int | None], StepTimeline]) -> str:
    parts = []
    for p, tests in _probe_records(doc):
        m: Mapping[str, float] = p.get("metrics") or {}
        # comms.<kind>.calls_per_step; documents written before it was named so: comms.<kind>.per_step
        named = sorted(m.items(), key=lambda kv: kv[0].endswith(".calls_per_step"))  # the new name wins
        calls_of = {k.split(".")[1]: float(v) for k, v in named
                    if k.startswith("comms.") and k.count(".") == 2 and k.endswith((".calls_per_step", ".per_step"))}
        kinds = sorted(calls_of)
        body = (f'<p class="note">{p.get("steps")} profiled step(s) after timing · worst rank\'s values · tests: '
                + ", ".join(f"<code>{esc(_short(n))}</code>" for n in tests) + "</p>")
        if kinds:
            rows = []
            for kind in kinds:
                calls = calls_of[kind]
                size = (f"{fmt_bytes(m[f'comms.{kind}.size_min'])} / {fmt_bytes(m[f'comms.{kind}.size_median'])} / "
                        f"{fmt_bytes(m[f'comms.{kind}.size_max'])}" if f"comms.{kind}.size_median" in m
                        else "unsized")
                per_step = (fmt_bytes(m[f"comms.{kind}.bytes_per_step"]) if f"comms.{kind}.bytes_per_step" in m
                            else "–")
                rows.append([esc(kind), f"{calls:g}", esc(per_step), esc(size)])
            body += _table(["collective", "calls / step", "bytes / step", "message size min / median / max"], rows,
                           "collectives")
            charts = bar_chart([(k, calls_of[k], COMM_COLOUR, f"{k}: {calls_of[k]:g} calls per step") for k in kinds],
                               "calls", f"collective calls per step of {p.get('label')}", "bars collectives",
                               width=WIDTH // 2)
            sized = [k for k in kinds if f"comms.{k}.bytes_per_step" in m]
            if sized:
                charts += bar_chart([(k, float(m[f"comms.{k}.bytes_per_step"]), "#E69F00", "") for k in sized],
                                    "bytes", f"collective bytes per step of {p.get('label')}",
                                    "bars collective-bytes", width=WIDTH // 2)
            body += f'<div class="pair">{charts}</div>'
        else:
            body += _empty("The comms probe did not run for this job.")
        extra = [(k, v) for k, v in sorted(m.items()) if k.startswith(("overlap.", "placement."))]
        if extra:
            body += _table(["probe metric", "value"], [[esc(k), esc(_probe_value(k, v))] for k, v in extra],
                           "probe-metrics")
        for name, why in sorted((p.get("not_measured") or {}).items()):
            body += f'<p class="note">{esc(name)}: not measured — {esc(why)}</p>'
        body += _timeline_block(p.get("traces") or [], read_timeline, p.get("label"))
        parts.append(f'<div class="probe"><h3>{esc(p.get("label"))}</h3>{body}</div>')
    return "".join(parts) or _empty("No probed job in this session (distperf.job(..., probes=(...))).")


def _probe_value(key: str, v: float) -> str:
    if key.endswith(("_s", ".cpu_s", "gpu_kernel_s")):
        return fmt_seconds(v)
    if "bytes" in key:
        return fmt_bytes(v)
    if key == "overlap.fraction":
        return f"{v:.0%}"
    return f"{v:.4g}"


def _timeline_block(traces: Sequence[str], read_timeline: Callable[[str, int | None], StepTimeline],
                    label: Any) -> str:
    timelines, problems = [], []
    seen_ranks: set[int | None] = set()
    for path in traces:
        rank = _rank_of(path)
        if rank in seen_ranks and rank is not None:
            continue  # one run's traces are enough for a picture of one step
        try:
            timelines.append(read_timeline(path, rank))
            seen_ranks.add(rank)
        except (OSError, ValueError, KeyError, TypeError) as e:
            problems.append(f"{path}: {e}")
    out = ""
    if timelines:
        t0 = timelines[0]
        comm = sum(e - s for s, e in _merge(((s, e) for tl in timelines[:1] for s, e, _ in tl.comm), 0.0))
        out += (f'<p class="note">one step (profiled step {t0.step + 1} of {t0.steps}) from the probe trace, '
                f'{esc(t0.source)}: where the communication lane has no overlap lane under it, it is exposed '
                f'(rank {t0.rank}: {comm / 1e3:.3g} ms of communication in a {t0.length / 1e3:.3g} ms step)</p>')
        out += legend([("bar", COMPUTE_COLOUR, "compute"), ("bar", COMM_COLOUR, "communication"),
                       ("bar", OVERLAP_COLOUR, "both at once (overlap)")])
        out += timeline_chart(timelines, f"compute and communication timeline of one step of {label}")
    for text in problems:
        out += f'<p class="note warn">timeline not drawn: {esc(text)}</p>'
    if not traces:
        out += '<p class="note">no probe trace recorded for this job</p>'
    return out


def _rank_of(path: str) -> int | None:
    name = os.path.basename(path)
    digits = "".join(ch for ch in name.rsplit("rank", 1)[-1] if ch.isdigit()) if "rank" in name else ""
    return int(digits) if digits else None


def _baseline_series(test: Mapping[str, Any], read_json: Callable[[str], Any]) -> dict[str, Any] | None:
    path = test.get("baseline_file")
    if not path or not os.path.exists(path):
        return None
    try:
        doc = read_json(path)
    except (OSError, ValueError, DistPerfError):  # drawn without the baseline's runs; the verdict still shows
        return None
    return doc.get("jobs") if isinstance(doc, dict) else None


def _baselines_section(doc: Mapping[str, Any], history: Mapping[tuple[str, str, str], TrendSeries],
                       read_json: Callable[[str], Any]) -> str:
    """A chart per verdict that has a baseline to compare with (tests sharing runs show it once); metrics
    without one are counted."""
    parts, seen, without = [], set(), 0
    outcomes = {t["nodeid"]: test_outcome(t) for t in _tests(doc)}
    sharing: dict[tuple[Any, ...], list[str]] = {}
    for t in _tests(doc):
        for v in _verdicts(t):
            sharing.setdefault(_verdict_key(v), []).append(t["nodeid"])
    for t in _tests(doc):
        xfailed = test_outcome(t) == "xfail"
        base_jobs: dict[str, Any] | None = None
        for v in _verdicts(t):
            key = _verdict_key(v)
            if key in seen:
                continue
            seen.add(key)
            series = history.get((t["nodeid"], str(v.get("job")), str(v.get("metric"))))
            has_trend = series is not None and bool(series.points)
            if v.get("baseline") is None and not has_trend:
                without += 1
                continue
            if base_jobs is None:
                base_jobs = _baseline_series(t, read_json) or {}
            row = _verdict_row(t, v, xfailed)
            head = (f'<h3>{esc(v.get("metric"))} of {esc(v.get("job"))} {row.badge()}</h3>'
                    f'<p class="note">tests: {_test_cell(sharing[key], outcomes)}</p>')
            body = f'<p class="note">{esc(row.value)}; threshold {esc(v.get("threshold_text") or "–")}. ' \
                   f'{esc(row.note)}</p>'
            if v.get("baseline") is not None:
                body += _baseline_distribution(t, v, base_jobs)
            if v.get("delta") is not None:
                thr = v.get("threshold")
                body += interval_chart(float(v["delta"]), *chart_ends(v), None, "at_most",
                                       "change against the baseline", "delta", row.outcome, value_name="Δ",
                                       fmt=lambda x: f"{x:+.1%}", ref=0.0,
                                       band=(-thr, thr) if thr is not None else None,
                                       interval=level_text(v) if has_interval(v) else None)
            if has_trend and series is not None:
                body += '<p class="note">history of this metric on this machine class</p>' + trend_chart(series)
            parts.append(f'<div class="baseline">{head}{body}</div>')
    if without:
        parts.append(_empty(f"{without} metric(s) have no baseline on this machine class yet (verdict 'new'); "
                            f"--distperf-save records them."))
    return "".join(parts) or _empty("No baseline verdict in this session (the gate runs with --distperf).")


def _verdict_key(v: Mapping[str, Any]) -> tuple[Any, ...]:
    return (v.get("job"), v.get("metric"), v.get("current"), v.get("baseline"), v.get("status"), v.get("delta"))


def _baseline_distribution(test: Mapping[str, Any], v: Mapping[str, Any], base_jobs: Mapping[str, Any]) -> str:
    metric, label = str(v.get("metric")), str(v.get("job"))
    base = ((base_jobs.get(label) or {}).get("metrics") or {}).get(metric) or {}
    job = _job_by_label(test, label) or {}
    runs = job.get("runs") or []
    unit = str(v.get("unit") or "")
    if metric == "step_time" and runs:
        rows = [(f"baseline run {i + 1}", [float(x) for x in s], "#8c959f", "square")
                for i, s in enumerate(base.get("samples") or [])]
        rows += [(f"current run {i + 1}", _run_steps(r), SIDE_COLOURS[0], "circle") for i, r in enumerate(runs)]
        return strip_chart(rows, "s", f"baseline vs current step times of {label}", "strip baseline")
    current = ([float(r["peak_memory"]) for r in runs if r.get("peak_memory") is not None]
               if metric == "peak_memory" else [])
    rows2 = [(f"baseline run {i + 1}", float(x), "#8c959f", "") for i, x in enumerate(base.get("runs") or [])]
    rows2 += [(f"current run {i + 1}", x, SIDE_COLOURS[0], "") for i, x in enumerate(current)]
    if not current and v.get("current") is not None:
        rows2.append(("current", float(v["current"]), SIDE_COLOURS[0], ""))
    if not rows2:
        return ""
    return bar_chart(rows2, unit, f"baseline vs current {metric} of {label}", "bars baseline")


def _environment_section(doc: Mapping[str, Any]) -> str:
    env = doc.get("environment") or {}
    out = "<h3>environment</h3>" + (_kv(env) if env else _empty("not recorded"))
    machines: dict[str, Any] = {}
    for t in _tests(doc):
        if t.get("machine_class"):
            machines.setdefault(t["machine_class"], t.get("machine") or {})
    out += "<h3>machine class</h3>"
    for name, machine in machines.items():
        out += f"<p><code class='machine-class'>{esc(name)}</code></p>"
        if machine:
            out += _kv(machine)
    if not machines:
        out += _empty("no machine class recorded (the baseline gate runs with --distperf)")
    out += "<h3>measured noise</h3>" + _noise(doc)
    inv = doc.get("invocation") or {}
    if inv:
        out += "<h3>invocation</h3>" + _kv(inv)
    return out


def _noise(doc: Mapping[str, Any]) -> str:
    """What the document measured about the machine's noise: other work's load on the host during each run, and
    each job's run-to-run spread (the verdict records' current spread), plus any noise record the session holds."""
    rows = []
    spreads: dict[tuple[str, str], tuple[float, int]] = {}  # (test, job) -> run-to-run variation, runs
    for t in _tests(doc):
        for v in _verdicts(t):
            cv = run_to_run(v)
            if v.get("metric") == "step_time" and cv is not None:
                spreads[(t["nodeid"], str(v.get("job")))] = (cv, int(v.get("current_runs") or 0))
    for view in unique_jobs(doc):
        job = view.job
        loads = [r.get("host_other_load_cores") for r in job.get("runs") or []]
        spread = next((spreads[(n, str(job.get("label")))] for n in view.tests
                       if (n, str(job.get("label"))) in spreads), None)
        figures = job.get("figures") or {}
        if figures.get("run_cv") is not None:  # the job's own figure, where the document has it
            spread = (float(figures["run_cv"]), len(job.get("runs") or []))
        rows.append([esc(job.get("label")),
                     esc(", ".join("–" if x is None else f"{x:.2f}" for x in loads) or "–"),
                     esc(f"{spread[0]:.1%} over {spread[1]} runs"
                         if spread else "–")])
    out = ""
    if rows:
        out += _table(["job", "other load on the host per run (cores)", "run-to-run variation of the step time"],
                      rows, "noise")
    for key in ("noise", "noise_floor"):
        extra = doc.get(key) or (doc.get("environment") or {}).get(key)
        if isinstance(extra, Mapping):
            out += _kv(extra)
    return out or _empty("no noise figures in this document")


# -- pages -----------------------------------------------------------------------------------------------------
_CSS = """
:root{color-scheme:light}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1f2328;margin:0;
 background:#fff}
header{background:#24292f;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#c9d1d9;font-size:12px}
nav{padding:8px 24px;border-bottom:1px solid #d0d7de;background:#f6f8fa;position:sticky;top:0;z-index:1}
nav a{margin-right:14px;color:#0969da;text-decoration:none}
main{padding:0 24px 40px;max-width:1240px}
section{margin-top:22px}h2{font-size:18px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
h3{font-size:14px;margin:18px 0 6px}
table{border-collapse:collapse;margin:6px 0;font-size:12.5px}
th,td{border:1px solid #d0d7de;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f6f8fa}
code{font:12px ui-monospace,SFMono-Regular,Menlo,Consolas,"DejaVu Sans Mono",monospace}
.note{color:#57606a;font-size:12px;margin:4px 0}.figures{font-size:13px;margin:4px 0}.warn{color:#9a6700}
.empty{color:#57606a;font-style:italic}
dl.summary{display:grid;grid-template-columns:max-content auto;gap:4px 14px;margin:8px 0}
dl.summary dt{font-weight:600}dl.summary dd{margin:0}
.badge{display:inline-block;padding:0 6px;border-radius:3px;font-size:12px;white-space:nowrap;line-height:18px}
.badge .sym{font-weight:700}
.v-pass{background:#dafbe1;color:#116329;border:1px solid #1a7f37}
.v-fail{background:repeating-linear-gradient(45deg,#ffebe9 0 3px,#ffc1bc 3px 6px);color:#82071e;
 border:2px solid #cf222e;font-weight:700}
.v-inconclusive{background:radial-gradient(#d4a72c 1px,#fff8c5 1.5px) 0 0/5px 5px;color:#6c3f00;
 border:1px dashed #9a6700}
.v-xfail{background:repeating-linear-gradient(0deg,#fbefff 0 3px,#e6d5fb 3px 4px),#fbefff;color:#512a97;
 border:1px dotted #8250df}
.v-improved{background:#ddf4ff;color:#0a3069;border:3px double #0969da}
.v-neutral{background:#f6f8fa;color:#424a53;border:1px solid #afb8c1}
.legend{font-size:12px;color:#57606a;margin:4px 0}.legend .key{margin-right:12px;white-space:nowrap}
.legend svg{vertical-align:middle}
svg.chart{display:block;margin:4px 0 10px;max-width:100%;height:auto;font-family:inherit}
.pair{display:flex;gap:8px;flex-wrap:wrap}.pair svg.chart{margin:4px 0}
.comparison,.job,.probe,.baseline{border-left:3px solid #d0d7de;padding-left:12px;margin:10px 0 18px}
"""

# Marks the page as drawn and records script errors in the DOM, so that a headless browser's --dump-dom shows
# both (the browser test reads them; no extra tooling needed).
_SCRIPT = """
window.__distperfErrors=[];
window.addEventListener('error',function(e){window.__distperfErrors.push(String(e.message||e));});
document.addEventListener('DOMContentLoaded',function(){
 var n=document.querySelectorAll('svg.chart').length;
 document.body.setAttribute('data-charts',String(n));
 document.body.setAttribute('data-errors',String(window.__distperfErrors.length));
 document.body.setAttribute('data-rendered','1');});
"""

_DEFS = ('<svg width="0" height="0" style="position:absolute" aria-hidden="true"><defs>'
         '<pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
         '<rect width="6" height="6" fill="#fff0ee"/><line x1="0" y1="0" x2="0" y2="6" stroke="#f4a39b" '
         'stroke-width="2"/></pattern></defs></svg>')


def _page(title: str, subtitle: str, nav: Sequence[tuple[str, str]], body: str) -> str:
    links = "".join(f'<a href="#{sid}">{esc(name)}</a>' for sid, name in nav)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{_CSS}{SVG_CSS}</style><script>{_SCRIPT}</script></head><body>"
            f"{_DEFS}<header><h1>{esc(title)}</h1><p>{esc(subtitle)}</p></header><nav>{links}</nav>"
            f"<main>{body}</main></body></html>\n")


SECTIONS = (("summary", "summary"), ("verdicts", "verdicts"), ("comparisons", "comparisons"), ("jobs", "jobs"),
            ("probes", "probes"), ("baselines", "baselines"), ("environment", "environment and noise"))


def render_html(doc: Mapping[str, Any], *, history: Iterable[TrendSeries] = (),
                read_timeline: Callable[[str, int | None], StepTimeline] = step_timeline,
                read_json: Callable[[str], Any] | None = None, title: str = "distperf report") -> str:
    """The session report as one HTML page. `history`: trend series of this session's metrics (from the history
    store), drawn under their baseline verdicts."""
    by_key = {s.key: s for s in history}
    reader = read_json or _read_json
    env = doc.get("environment") or {}
    subtitle = " · ".join(x for x in (doc.get("created_at") or "", (env.get("git_commit") or "")[:12],
                                      env.get("host") or "") if x)
    body = "".join([
        _section("summary", "Summary", _summary(doc)),
        _section("verdicts", "Verdicts", _verdict_table(doc)),
        _section("comparisons", "Comparisons", _comparisons(doc),
                 "each run's step times (slowest rank per step), interleaved as they ran; the ratio with its "
                 "interval against the limit (hatched: beyond it)"),
        _section("jobs", "Jobs", _jobs_section(doc),
                 "a step's time is its slowest rank's: a straggler shows as a rank shifted right"),
        _section("probes", "Probes", _probes_section(doc, read_timeline)),
        _section("baselines", "Baselines", _baselines_section(doc, by_key, reader),
                 "grey band: the tolerated change (± threshold); diamond: the change with its interval"),
        _section("environment", "Environment, machine and noise", _environment_section(doc)),
    ])
    return _page(title, subtitle, SECTIONS, body)


def render_history(series: Sequence[TrendSeries], *, title: str = "distperf history", subtitle: str = "") -> str:
    """A trend page: one chart per metric over sessions, change points drawn with their commit range."""
    groups: dict[str, list[TrendSeries]] = {}
    for s in series:
        groups.setdefault(s.machine_class, []).append(s)
    parts = []
    for machine_class, items in sorted(groups.items()):
        parts.append(f"<h2>machine class <code>{esc(machine_class)}</code></h2>")
        for s in sorted(items, key=lambda s: (s.test, s.job, s.metric)):
            cps = "; ".join(f"{cp.commit_before[:12]}..{cp.commit_after[:12]}"
                            + (f" ({cp.after / cp.before - 1:+.1%})" if cp.before and cp.after is not None else "")
                            + (f" {cp.note}" if cp.note else "") for cp in s.change_points) or "none"
            parts.append(f'<div class="trend-block"><h3><code>{esc(_short(s.test))}</code> · {esc(s.metric)} of '
                         f'{esc(s.job)}</h3><p class="note">{len(s.points)} session(s); change points: {esc(cps)}</p>'
                         f"{trend_chart(s)}</div>")
    body = _section("trends", "Trends", "".join(parts) or _empty("No history recorded."))
    return _page(title, subtitle or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                 (("trends", "trends"),), body)


def _read_json(path: str) -> Any:
    from pytest_distperf.jsonio import read_json

    return read_json(path)


def write_text(path: str, text: str) -> None:
    """Write a report file whole or not at all (temp file, fsync, rename): a reader never sees half a page."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_html(path: str, doc: Mapping[str, Any], history: Iterable[TrendSeries] = ()) -> None:
    from pytest_distperf.redact import redact

    write_text(path, render_html(redact(doc), history=history))  # also for a document not from this session
