"""The HTML report's charts, each an inline SVG drawn on svg.Chart and returned as Markup (svg.py escapes every
text it writes): strip plots, an estimate with its interval against a limit, bars, a step's timeline and
breakdown, and a metric's trend over sessions. Every mark carries a class and a <title> (hover text)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

from markupsafe import Markup

if TYPE_CHECKING:
    from pytest_distperf.store.history.trend import Trend

from pytest_distperf.figures.quantities import step_time_of
from pytest_distperf.figures.units import fmt_seconds
from pytest_distperf.rank.probes.results import StepTimeline
from pytest_distperf.report.outcomes import LIMIT_SIGN
from pytest_distperf.report.rows import fmt_unit
from pytest_distperf.store.history.trend import ChangePoint, TrendPoint, short_commit
from pytest_distperf.report.svg import (COMM_COLOUR, COMPUTE_COLOUR, MUTED, OVERLAP_COLOUR, SIDE_COLOURS, Chart, esc,
                                        legend, nice_ticks, padded)

WIDTH = 900  # px of every chart; the page is at most 1240 wide


# -- a metric over sessions, as the history store hands it in (store/history/trend.py) ----------------------
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


def trend_series(found: "Iterable[Trend]") -> list[TrendSeries]:
    """The history's trends (store/history.trends, session_trends) as the trend chart's input."""
    return [TrendSeries(machine_class=t.key.machine_class, test=t.key.test, job=t.key.job, metric=t.key.metric,
                        unit=t.unit, points=list(t.points), change_points=list(t.change_points),
                        direction=t.direction) for t in found]


def axis(unit: str, lo: float, hi: float, count: int = 5) -> tuple[Callable[[float], str], str, list[float]]:
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


def label_room(labels: Iterable[str]) -> int:
    """Left margin for row labels (11 px text), at most 190 px."""
    return int(min(190, 16 + 6.3 * max((len(x) for x in labels), default=4)))


def strip_chart(rows: Sequence[tuple[str, list[float], str, str]], unit: str, label: str, css: str,
                width: int = WIDTH, notes: Mapping[int, tuple[str, bool]] | None = None) -> Markup:
    """One row per series: (row label, values, colour, marker 'circle'|'square'); each value a dot (spread a
    little within the row, in order), the row's median a bar. `notes`: row index -> (text at its right, loud)."""
    row_h = 22
    values = [v for _, vs, _, _ in rows for v in vs]
    lo, hi = padded(values)
    fmt, unit_name, ticks = axis(unit, lo, hi, 8)
    c = Chart(width, 20 + row_h * len(rows) + 34, label, css, left=label_room(r[0] for r in rows),
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
            med = step_time_of(vs)  # each row is step times: its median is the step-time figure
            c.line(x(med), yc - 9, x(med), yc + 9, "#24292f", "median", 2.5,
                   title=f"{name}: median {fmt_unit(med, unit)}")
        if notes and i in notes:
            text, loud = notes[i]
            c.text(c.x1 + 8, yc + 4, text, "straggler" if loud else "row-note", fill="#a40e26" if loud else MUTED,
                   size=11, weight="bold" if loud else "")
    return Markup(c.render())


def interval_chart(value: float, low: float | None, high: float | None, limit: float | None, direction: str,
                   label: str, css: str, outcome: str, width: int = WIDTH, value_name: str = "A/B",
                   fmt: Callable[[float], str] = lambda v: f"{v:.3g}", ref: float | None = None,
                   band: tuple[float, float] | None = None, interval: str | None = None) -> Markup:
    """A point with its interval (`interval`: its text; None: none; a None end is unbounded) against the limit,
    a dashed line with the side beyond `direction`'s good side hatched; `ref`: a reference line; `band`: a
    tolerated region in light grey."""
    lo, hi = padded([value, *(v for v in (low, high, limit, ref) if v is not None), *(band or ())], pad=0.12)
    c = Chart(width, 78, label, css, left=170, right=20, top=24, bottom=26)
    x = c.x_scale((lo, hi))
    c.x_axis(x, fmt, "", nice_ticks(lo, hi, 8))
    mid = (c.y0 + c.y1) / 2
    ends = ("unbounded" if low is None else fmt(low), "unbounded" if high is None else fmt(high))
    text = f"{value_name} {fmt(value)}" + (f", {interval} [{ends[0]}, {ends[1]}]" if interval else ", no interval") + \
        (f"; limit {LIMIT_SIGN[direction]} {fmt(limit)}" if limit is not None else "")
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
    return Markup(c.render())


def bar_chart(rows: Sequence[tuple[str, float, str, str]], unit: str, label: str, css: str,
              width: int = WIDTH) -> Markup:
    """Horizontal bars: (row label, value, colour, hover text)."""
    row_h = 20
    values = [v for _, v, _, _ in rows]
    hi = max(values + [0.0]) * 1.08 or 1.0
    fmt, unit_name, ticks = axis(unit, 0, hi, 6)
    c = Chart(width, 16 + row_h * len(rows) + 32, label, css, left=label_room(r[0] for r in rows), right=80, top=8)
    x = c.x_scale((0, hi))
    c.x_axis(x, fmt, unit_name, ticks)
    for i, (name, v, colour, title) in enumerate(rows):
        y = c.y0 + 8 + i * row_h
        c.text(c.x0 - 8, y + 12, name, "row-lbl", "end")
        c.rect(x(0), y + 2, x(v) - x(0), row_h - 6, colour, "bar", title or f"{name}: {fmt_unit(v, unit)}")
        c.text(x(v) + 4, y + 12, fmt_unit(v, unit), "val-lbl")
    return Markup(c.render())


def contribution_chart(rows: Sequence[tuple[str, float, str]], label: str, width: int = WIDTH) -> Markup:
    """Each row's change in time per step as a bar from zero (row label, seconds, hover text): slower to the
    right in red, faster to the left in blue."""
    row_h = 20
    values = [v for _, v, _ in rows]
    lo, hi = min(values + [0.0]), max(values + [0.0])
    pad = (hi - lo) * 0.08 or 1e-6
    lo, hi = (lo - pad if lo < 0 else 0.0), (hi + pad if hi > 0 else 0.0)
    fmt, unit_name, ticks = axis("s", lo, hi, 6)
    c = Chart(width, 16 + row_h * len(rows) + 32, label, "contributions", left=label_room(r[0] for r in rows),
              right=80, top=8)
    x = c.x_scale((lo, hi))
    c.x_axis(x, fmt, f"change in time per step ({unit_name})", ticks)
    c.line(x(0), c.y0, x(0), c.y1, "", "axis")
    for i, (name, v, title) in enumerate(rows):
        y = c.y0 + 8 + i * row_h
        c.text(c.x0 - 8, y + 12, name, "row-lbl", "end")
        left, right = sorted((x(0), x(v)))
        c.rect(left, y + 2, max(right - left, 1.0), row_h - 6, "#cf222e" if v > 0 else "#0969da", "bar", title)
        c.text(right + 4, y + 12, f"{v * 1e3:+.3g} ms", "val-lbl")
    return Markup(c.render())


def timeline_chart(timelines: Sequence[StepTimeline], label: str, width: int = WIDTH) -> Markup:
    """Per rank three lanes over one step: compute, communication, and where both ran (overlap)."""
    lane_h, gap = 14, 10
    length = max((t.length for t in timelines), default=1.0) or 1.0
    c = Chart(width, 12 + len(timelines) * (3 * lane_h + gap) + 30, label, "timeline", left=170, right=16, top=8)
    x = c.x_scale((0.0, length))
    c.x_axis(x, lambda v: f"{v / 1e3:.4g}", "ms from the step's start", nice_ticks(0.0, length, 10))
    for i, t in enumerate(timelines):
        y = c.y0 + 4 + i * (3 * lane_h + gap)
        who = f"rank {t.rank}"
        both = t.overlap()
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
    return Markup(c.render())


def trend_chart(series: TrendSeries, width: int = WIDTH) -> Markup:
    """A metric over sessions (x = session order, labelled by commit), change points as vertical lines with
    their commit range and the levels either side."""
    pts = series.points
    values = [p.value for p in pts] + [v for p in pts for v in p.runs]
    lo, hi = padded(values, pad=0.1)
    fmt, unit_name, ticks = axis(series.unit, lo, hi, 5)
    c = Chart(width, 220, f"{series.metric} of {series.job} over {len(pts)} sessions", "trend", left=64, right=16,
              top=22, bottom=46)
    x = c.x_scale((-0.5, max(len(pts) - 0.5, 0.5)))
    y = c.y_scale((lo, hi))
    c.y_axis(y, fmt, unit_name, ticks)
    c.line(c.x0, c.y1, c.x1, c.y1, "#8c959f", "axis")
    step = max(1, len(pts) // 12)
    for i in range(0, len(pts), step):
        c.text(x(i), c.y1 + 14, short_commit(pts[i].git_commit)[:7], "tick-lbl", "middle", size=9)
    c.text((c.x0 + c.x1) / 2, c.height - 4, "sessions, oldest first (commit)", "axis-title", "middle")
    for i, p in enumerate(pts):  # the spread of the session's runs
        if p.runs:
            c.line(x(i), y(min(p.runs)), x(i), y(max(p.runs)), "#8c959f", "whisker", 1)
    c.polyline([(x(i), y(p.value)) for i, p in enumerate(pts)], SIDE_COLOURS[0], "trend-line")
    for i, p in enumerate(pts):
        c.circle(x(i), y(p.value), 3, SIDE_COLOURS[0], "trend-pt",
                 f"{short_commit(p.git_commit)} {p.created_at.isoformat()}: {fmt_unit(p.value, series.unit)}")
    bounds = [0] + [cp.index for cp in series.change_points] + [len(pts)]
    for cp in series.change_points:
        xc = x(cp.index - 0.5)
        before, after = short_commit(cp.before.git_commit), short_commit(cp.after.git_commit)
        c.line(xc, c.y0 - 8, xc, c.y1, "#cf222e", "change-point", 2, "6 3",
               f"change point between {before} and {after}")
        change = "" if cp.change is None else f" {cp.change:+.1%}"
        c.text(xc + 4, c.y0 - 10 + 8, f"{before[:7]}..{after[:7]}{change}", "cp-lbl", fill="#a40e26", size=10,
               weight="bold")
    for k, cp in enumerate(series.change_points):  # the levels either side, as the method reported them
        for level, a, b in ((cp.before_mean, bounds[k], cp.index), (cp.after_mean, cp.index, bounds[k + 2])):
            c.line(x(a - 0.4), y(level), x(b - 0.6), y(level), "#cf222e", "level", 1.5)
    return Markup(c.render())


BREAKDOWN_COLOURS = {"forward": "#0072B2", "backward": "#56B4E9", "optimizer": "#E69F00", "other": "#bbbbbb"}
BREAKDOWN_ORDER = ("forward", "backward", "optimizer", "other")


def breakdown_chart(ranks: Sequence[Mapping[str, Any]], label: str) -> tuple[Markup, Markup]:
    """(legend, chart) of where a step's time goes (forward / backward / optimizer / other), per rank record
    that has a `step_breakdown`."""
    phases = sorted({p for r in ranks for p in r["step_breakdown"]} - {"total"},
                    key=lambda p: (list(BREAKDOWN_ORDER) + [p]).index(p))
    total = max(sum(float(r["step_breakdown"].get(p) or 0.0) for p in phases) for r in ranks) or 1.0
    c = Chart(WIDTH, 16 + 20 * len(ranks) + 32, label, "breakdown", left=170, right=90, top=8)
    fmt, unit_name, ticks = axis("s", 0, total * 1.05, 8)
    x = c.x_scale((0, total * 1.05))
    c.x_axis(x, fmt, unit_name, ticks)
    for i, r in enumerate(ranks):
        y = c.y0 + 8 + i * 20
        c.text(c.x0 - 8, y + 12, f"rank {r.get('rank')}", "row-lbl", "end")
        acc = 0.0
        for p in phases:
            v = float(r["step_breakdown"].get(p) or 0.0)
            c.rect(x(acc), y + 2, x(acc + v) - x(acc), 14, BREAKDOWN_COLOURS.get(p, "#999"), f"seg seg-{p}",
                   f"rank {r.get('rank')} {p}: {fmt_seconds(v)}", stroke="#fff")
            acc += v
        c.text(x(acc) + 4, y + 12, fmt_seconds(acc), "val-lbl")
    key = legend([("bar", BREAKDOWN_COLOURS.get(p, "#999"), p) for p in phases])
    return Markup(key), Markup(c.render())
