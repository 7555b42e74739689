"""A minimal self-contained HTML page of trends (inline SVG, no script, no network), used by
`python -m pytest_distperf history --html` while the report package offers no `render_history`."""

from __future__ import annotations

import html
import os

from pytest_distperf.gate.regression import fmt_value
from pytest_distperf.history.text import describe
from pytest_distperf.history.trend import Trend, short_commit

WIDTH, HEIGHT, PAD, LEFT = 760, 180, 36, 84  # LEFT: room for the value labels
COLOURS = {"regression": "#b2182b", "improvement": "#2166ac", "change": "#555"}


def render_page(trends: list[Trend], title: str = "distperf history") -> str:
    parts = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}h2{font-size:15px;margin:1.6em 0 .3em}"
             ".meta{color:#555}svg{background:#fafafa;border:1px solid #ddd}li{margin:.2em 0}"
             "text{font:11px system-ui,sans-serif;fill:#444}</style></head><body>",
             f"<h1>{html.escape(title)}</h1>",
             f"<p class='meta'>{len(trends)} series, {sum(len(t.change_points) for t in trends)} change point(s); "
             "a point is one session (median of its runs); dashed lines mark change points, grey bars the "
             "segment means.</p>"]
    for t in trends:
        parts.append(_section(t))
    parts.append("</body></html>\n")
    return "".join(parts)


def write_page(trends: list[Trend], path: str) -> None:
    """Write atomically (a reader never sees half a page)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(render_page(trends))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _section(t: Trend) -> str:
    k = t.key
    head = (f"<section><h2>{html.escape(k.test)} · {html.escape(k.job)} · {html.escape(k.metric)}</h2>"
            f"<div class='meta'>{html.escape(k.machine_class)} · {len(t.points)} sessions · {html.escape(t.unit)}, "
            f"{html.escape(t.direction)} is better</div>")
    items = "".join(f"<li style='color:{COLOURS[c.verdict]}'>{html.escape(describe(c, t.unit))}</li>"
                    for c in t.change_points) or "<li>no change point</li>"
    return head + _svg(t) + f"<ul>{items}</ul></section>"


def _svg(t: Trend) -> str:
    values = [p.value for p in t.points]
    lo, hi = min(values), max(values)
    span = (hi - lo) or abs(hi) or 1.0
    lo, hi = lo - 0.08 * span, hi + 0.08 * span
    n = len(values)

    def x(i: float) -> float:
        return LEFT + (WIDTH - LEFT - PAD) * (i / (n - 1) if n > 1 else 0.5)

    def y(v: float) -> float:
        return HEIGHT - PAD + (v - lo) / (hi - lo) * (2 * PAD - HEIGHT)

    out = [f"<svg role='img' width='{WIDTH}' height='{HEIGHT}' viewBox='0 0 {WIDTH} {HEIGHT}'>"]
    bounds = [0, *[c.index for c in t.change_points], n]
    for a, b in zip(bounds, bounds[1:]):
        mean = sum(values[a:b]) / (b - a)
        out.append(f"<line x1='{x(a):.1f}' x2='{x(b - 1):.1f}' y1='{y(mean):.1f}' y2='{y(mean):.1f}' "
                   f"stroke='#bbb' stroke-width='6'/>")
    for c in t.change_points:
        cx = (x(c.index - 1) + x(c.index)) / 2
        out.append(f"<line x1='{cx:.1f}' x2='{cx:.1f}' y1='{PAD / 2}' y2='{HEIGHT - PAD}' "
                   f"stroke='{COLOURS[c.verdict]}' stroke-dasharray='4 3'>"
                   f"<title>{html.escape(c.commit_range)}</title></line>"
                   f"<text x='{cx + 3:.1f}' y='{PAD / 2 + 10}'>{html.escape(c.commit_range)}</text>")
    path = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
    out.append(f"<polyline points='{path}' fill='none' stroke='#333' stroke-width='1'/>")
    for i, p in enumerate(t.points):
        tip = html.escape(f"{p.created_at:%Y-%m-%d %H:%M} {short_commit(p.git_commit)} {fmt_value(p.value, t.unit)}")
        out.append(f"<circle cx='{x(i):.1f}' cy='{y(p.value):.1f}' r='3' fill='#333'><title>{tip}</title></circle>")
    for v in sorted({min(values), max(values)}):
        out.append(f"<text x='4' y='{y(v) + 4:.1f}'>{html.escape(fmt_value(v, t.unit))}</text>")
    out.append("</svg>")
    return "".join(out)
