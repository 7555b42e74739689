"""The session's HTML report (`--distperf-html PATH`) and the history trend page: one self-contained file each,
the view (report/views.py) laid out by autoescaping Jinja2 templates with the styles and script inlined."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterable, Mapping, Sequence

import jinja2
from markupsafe import Markup

from pytest_distperf.fs.jsonio import write_text_atomic as write_text
from pytest_distperf.report.document import SessionDocument
from pytest_distperf.report.charts import ChangePoint, TrendPoint, TrendSeries, trend_chart
from pytest_distperf.report.outcomes import LEGEND, style
from pytest_distperf.figures.wording import short_test
from pytest_distperf.report.views import SECTIONS, report_view

__all__ = ["ChangePoint", "SECTIONS", "TrendPoint", "TrendSeries", "render_history", "render_html", "write_html",
           "write_text"]


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("pytest_distperf.report", "templates"),
                             autoescape=jinja2.select_autoescape(("html.j2",), default=True),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.globals.update(style=style, legend_outcomes=LEGEND)
    return env


def _asset(name: str) -> Markup:
    """A style sheet or script from the templates folder, inlined as it is (it holds no document text)."""
    loader = _environment().loader
    assert loader is not None
    source, _, _ = loader.get_source(_environment(), name)
    return Markup(source)


def _render(template: str, **context: Any) -> str:
    return _environment().get_template(template).render(css=_asset("report.css"), script=_asset("report.js"),
                                                        **context) + "\n"


def render_html(doc: Mapping[str, Any], *, history: Iterable[TrendSeries] = (),
                title: str = "distperf report") -> str:
    """A JSON report's document as one HTML page; `history`: trend series of its metrics."""
    view = report_view(SessionDocument.from_json(doc), history, title)
    return _render("report.html.j2", view=view, title=view.title, subtitle=view.subtitle, nav=view.sections)


@dataclass
class _TrendBlock:
    test: str
    metric: str
    job: str
    sessions: int
    change_points: str
    chart: Markup


def render_history(series: Sequence[TrendSeries], *, title: str = "distperf history", subtitle: str = "") -> str:
    """A trend page: one chart per metric over sessions, change points drawn with their commit range."""
    by_class: dict[str, list[TrendSeries]] = {}
    for s in series:
        by_class.setdefault(s.machine_class, []).append(s)
    groups = [{"machine_class": machine_class,
               "blocks": [_TrendBlock(short_test(s.test), s.metric, s.job, len(s.points),
                                      "; ".join(cp.text() for cp in s.change_points) or "none", trend_chart(s))
                          for s in sorted(items, key=lambda s: (s.test, s.job, s.metric))]}
              for machine_class, items in sorted(by_class.items())]
    subtitle = subtitle or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return _render("history.html.j2", groups=groups, title=title, subtitle=subtitle, nav=(("trends", "trends"),))


def write_html(path: str, doc: Mapping[str, Any], history: Iterable[TrendSeries] = ()) -> None:
    from pytest_distperf.store.redact import redact

    write_text(path, render_html(redact(doc), history=history))  # also for a document not from this session
