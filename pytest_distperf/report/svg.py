"""Inline SVG primitives for the HTML reports: a `Chart` (pixel frame, linear scales, marks) and a legend.

Hand-written SVG rather than a plotting library: the report must open offline and stay small (Plotly or
Vega would inline megabytes of runtime), and every mark gets a class and a <title> that tests can check.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

Fmt = Callable[[float], str]
Scale = Callable[[float], float]

# Colour-blind-safe pair (Okabe-Ito) for the two sides of a comparison; the sides also differ in marker
# shape (circle vs square), so they read in grey too.
SIDE_COLOURS = ("#0072B2", "#D55E00")
RANK_COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
COMPUTE_COLOUR = "#6b7fa8"
COMM_COLOUR = "#D55E00"
OVERLAP_COLOUR = "#009E73"
MUTED = "#57606a"


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 5 x 10^n steps)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return []
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks, t = [], start
    while t <= hi + step * 1e-9:
        ticks.append(0.0 if abs(t) < step * 1e-9 else t)
        t += step
    return ticks


def padded(values: Iterable[float], pad: float = 0.06) -> tuple[float, float]:
    """A domain around the values, widened a little so marks do not sit on the frame."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return 0.0, 1.0
    lo, hi = min(vals), max(vals)
    span = hi - lo or abs(hi) * 0.1 or 1.0
    return lo - span * pad, hi + span * pad


def linear(domain: tuple[float, float], pixels: tuple[float, float]) -> Scale:
    """The linear map of `domain` onto `pixels` (a point domain maps to the middle)."""
    (d0, d1), (r0, r1) = domain, pixels
    return lambda v: (r0 + r1) / 2 if d1 == d0 else r0 + (v - d0) / (d1 - d0) * (r1 - r0)


@dataclass
class Chart:
    """An SVG of `width` x `height` pixels with a plot area inside the margins."""

    width: int
    height: int
    label: str  # aria-label: what the chart shows
    css_class: str
    left: int = 60
    right: int = 16
    top: int = 12
    bottom: int = 32
    parts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.x0, self.x1 = self.left, self.width - self.right  # the plot area, in pixels
        self.y0, self.y1 = self.top, self.height - self.bottom

    def x_scale(self, domain: tuple[float, float]) -> Scale:
        return linear(domain, (self.x0, self.x1))

    def y_scale(self, domain: tuple[float, float]) -> Scale:
        return linear(domain, (self.y1, self.y0))

    def add(self, element: str) -> None:
        self.parts.append(element)

    # -- marks -------------------------------------------------------------------------------------------------
    def circle(self, x: float, y: float, r: float, fill: str, cls: str, title: str = "") -> None:
        self.add(f'<circle class="{cls}" cx="{x:.1f}" cy="{y:.1f}" r="{r:g}" fill="{fill}">{_title(title)}</circle>')

    def rect(self, x: float, y: float, w: float, h: float, fill: str, cls: str, title: str = "",
             stroke: str = "") -> None:
        s = f' stroke="{stroke}"' if stroke else ""
        self.add(f'<rect class="{cls}" x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{max(h, 0):.1f}" '
                 f'fill="{fill}"{s}>{_title(title)}</rect>')

    def line(self, x1: float, y1: float, x2: float, y2: float, stroke: str, cls: str, width: float = 1,
             dash: str = "", title: str = "") -> None:
        """`stroke` "" leaves colour (and width 1) to the page's CSS for the class (axes, ticks, grid)."""
        attrs = (f' stroke="{stroke}"' if stroke else "") + (f' stroke-width="{width:g}"' if width != 1 else "") \
            + (f' stroke-dasharray="{dash}"' if dash else "")
        self.add(f'<line class="{cls}" x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}"{attrs}>'
                 f'{_title(title)}</line>')

    def polyline(self, points: Sequence[tuple[float, float]], stroke: str, cls: str) -> None:
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        self.add(f'<polyline class="{cls}" points="{pts}" fill="none" stroke="{stroke}" stroke-width="1.5">'
                 f'</polyline>')

    def text(self, x: float, y: float, text: str, cls: str = "lbl", anchor: str = "start", fill: str = "",
             size: int | None = None, weight: str = "") -> None:
        """Font size and colour default to the page's CSS for the class (templates/report.css)."""
        attrs = (f' text-anchor="{anchor}"' if anchor != "start" else "") + (f' font-size="{size}"' if size else "") \
            + (f' fill="{fill}"' if fill else "") + (f' font-weight="{weight}"' if weight else "")
        self.add(f'<text class="{cls}" x="{x:.1f}" y="{y:.1f}"{attrs}>{esc(text)}</text>')

    # -- axes --------------------------------------------------------------------------------------------------
    def x_axis(self, scale: Scale, fmt: Fmt, title: str, ticks: Sequence[float]) -> None:
        self.line(self.x0, self.y1, self.x1, self.y1, "", "axis")
        for t in ticks:
            x = scale(t)
            self.line(x, self.y1, x, self.y1 + 4, "", "tick")
            self.line(x, self.y0, x, self.y1, "", "grid")
            self.text(x, self.y1 + 15, fmt(t), "tick-lbl", "middle")
        if title:
            self.text((self.x0 + self.x1) / 2, self.height - 3, title, "axis-title", "middle")

    def y_axis(self, scale: Scale, fmt: Fmt, title: str, ticks: Sequence[float]) -> None:
        self.line(self.x0, self.y0, self.x0, self.y1, "", "axis")
        for t in ticks:
            y = scale(t)
            self.line(self.x0 - 4, y, self.x0, y, "", "tick")
            self.line(self.x0, y, self.x1, y, "", "grid")
            self.text(self.x0 - 6, y + 3.5, fmt(t), "tick-lbl", "end")
        if title:
            self.add(f'<text class="axis-title" transform="translate(11,{(self.y0 + self.y1) / 2:.1f}) rotate(-90)" '
                     f'text-anchor="middle">{esc(title)}</text>')

    def render(self) -> str:
        # Grid lines go first so that marks draw over them.
        grid = [p for p in self.parts if p.startswith('<line class="grid"')]
        rest = [p for p in self.parts if not p.startswith('<line class="grid"')]
        return (f'<svg class="chart {self.css_class}" role="img" aria-label="{esc(self.label)}" '
                f'xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {self.width} {self.height}" '
                f'width="{self.width}" height="{self.height}">'
                + "".join(grid) + "".join(rest) + "</svg>")


def _title(text: str) -> str:
    return f"<title>{esc(text)}</title>" if text else ""


_MARKERS = {  # a legend's marker shape -> its SVG, filled with the colour
    "circle": '<svg width="12" height="12"><circle cx="6" cy="6" r="4.5" fill="{}"/></svg>',
    "square": '<svg width="12" height="12"><rect x="1.5" y="1.5" width="9" height="9" fill="none" stroke="{}" '
              'stroke-width="2"/></svg>',
    "bar": '<svg width="14" height="12"><rect x="0" y="2" width="14" height="8" fill="{}"/></svg>',
}


def legend(items: Sequence[tuple[str, str, str]]) -> str:
    """An HTML legend: (marker shape 'circle' | 'square' | 'bar', colour, text)."""
    return ('<div class="legend">' + "".join(f'<span class="key">{_MARKERS.get(shape, _MARKERS["bar"]).format(colour)} '
                                             f'{esc(text)}</span>' for shape, colour, text in items) + "</div>")
