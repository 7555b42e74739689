"""History of every session's results in a database, and the step changes in it.

Needs the `history` extra (`pip install "pytest-distperf[history]"`: SQLAlchemy, psycopg 3, ruptures); this
package's `__init__` imports none of them, so importing it is cheap and the error for a missing extra is ours.

Public functions (the only ones other modules should call; errors are `HistoryError`s whose message starts
with `option`):

- `record_session(url, report_doc, ...) -> Recorded`: append a session's `--distperf-json` document (the dict
  `report.files.json_report` returns) to the history at `url`: a file path or `sqlite:///path/history.db`
  (SQLite, created with its folder if missing) or `postgresql://user:password@host:port/db`. One row per run of
  every metric of every test's jobs. `commit` overrides the report's `environment.git_commit` (e.g.
  `$GITHUB_SHA`). The same document twice is stored once (`Recorded.duplicate`).

- `check_url(url, option) -> str`: validate a URL's form without connecting (for option checking before any job
  starts); returns it with the password hidden. Raises `HistoryUrlError`.

- `trends(url, *, test, job, metric, machine_class, alpha, min_size, min_change, option) -> list[Trend]`
  One `Trend` per (machine class, test, job, metric) whose fields contain the given substrings. A `Trend` has
  `key` (`machine_class`, `test`, `job`, `metric`), `unit` ("s", "bytes", "calls", ...), `direction` ("lower" or
  "higher" is better), `kind`, `points` (one `TrendPoint` per session, oldest first: `created_at`,
  `git_commit`, `session_id`, `value` = median of the session's runs, `runs`, versions, `config_hash`) and
  `change_points` (`ChangePoint`: `index` of the first point after the step, `before`/`after` points and so
  `commit_range`, `before_mean`, `after_mean`, `change` = after/before - 1, `pvalue`, `tstat`, `verdict`
  = regression | improvement | change, `config_changed`, `environment_changes`); with none, `strongest` is the
  split that was tried first and did not hold (a `ChangePoint` with its p-value), or None. `Trend.to_dict()` is
  JSON-ready. `comms.*` values are per step, per rank (the rank with the most).

- `render_text(trends, points=False) -> str`: the CLI's text.

- `session_trends(url, report_doc, **change_point_settings) -> list[Trend]`: the trends of exactly the series
  (machine class, test, job, metric) that this report document measured, e.g. for its HTML report.

- The HTML report draws them through `report.charts.trend_series(trends)`, its input type
  (`render_html(doc, history=...)`, `render_history(series)`): per point the session's median with its runs'
  range as the whisker; per change point the commit range, the segment means and a note with the verdict,
  change, p-value and what else changed there.

`python -m pytest_distperf history URL ...` is the command line (report/history_cli.py).
"""

from __future__ import annotations

import copy
import importlib.util
from typing import TYPE_CHECKING, Any

from pytest_distperf.store.history.errors import HistoryError, HistoryUrlError, ReportDocumentError, SchemaVersionError

if TYPE_CHECKING:
    from pytest_distperf.store.history.store import Recorded
    from pytest_distperf.store.history.trend import Trend

__all__ = ["HistoryError", "HistoryUrlError", "ReportDocumentError", "SchemaVersionError", "check_url",
           "record_session", "render_text", "session_trends", "trends"]

EXTRA_HINT = 'pip install "pytest-distperf[history]"'


def record_session(url: str, report_doc: dict[str, Any], *, session_id: str | None = None,
                   commit: str | None = None, option: str = "--distperf-history") -> Recorded:
    """Append one session's report document to the history at `url` (see the module docstring)."""
    _require_extra(option, "sqlalchemy")
    from pytest_distperf.store.history.ingest import read_report
    from pytest_distperf.store.history.store import HistoryStore

    from pytest_distperf.store.redact import redact

    if commit:
        report_doc = copy.deepcopy(report_doc)
        report_doc["environment"] = {**report_doc.get("environment", {}), "git_commit": commit}
    report_doc = redact(report_doc)  # history rows never hold a secret (also for a report ingested by hand)
    session, rows = read_report(report_doc, f"{option}: the session's report")
    with HistoryStore(url, option=option) as store:
        return store.record(session, rows, session_id=session_id)


def check_url(url: str, option: str = "--distperf-history") -> str:
    """The URL's form checked (scheme, a file for SQLite), nothing opened; the password hidden."""
    _require_extra(option, "sqlalchemy")
    from pytest_distperf.store.history.store import resolve_url

    from pytest_distperf.store.redact import redact_text

    return redact_text(resolve_url(url, option).render_as_string(hide_password=False))  # the one redaction


def trends(url: str, *, test: str | None = None, job: str | None = None, metric: str | None = None,
           machine_class: str | None = None, alpha: float = 0.001, min_size: int = 3, min_change: float = 0.0,
           option: str = "history URL") -> list[Trend]:
    """The trends with their change points (see the module docstring); the database must exist."""
    _require_extra(option, "sqlalchemy", "ruptures", "scipy")
    from pytest_distperf.store.history.store import HistoryStore
    from pytest_distperf.store.history.trend import build_trends

    with HistoryStore(url, option=option, create=False) as store:
        return build_trends(store, test=test, job=job, metric=metric, machine_class=machine_class, alpha=alpha,
                            min_size=min_size, min_change=min_change)


def session_trends(url: str, report_doc: dict[str, Any], *, alpha: float = 0.001, min_size: int = 3,
                   min_change: float = 0.0, option: str = "--distperf-history") -> list[Trend]:
    """The trends of the series this report measured (see the module docstring)."""
    _require_extra(option, "sqlalchemy", "ruptures", "scipy")
    from pytest_distperf.store.history.ingest import read_report
    from pytest_distperf.store.history.store import HistoryStore, SeriesKey
    from pytest_distperf.store.history.trend import build_trends

    _session, rows = read_report(report_doc, f"{option}: the session's report")
    keys = {SeriesKey(r.machine_class, r.test, r.job, r.metric) for r in rows}
    with HistoryStore(url, option=option, create=False) as store:
        return build_trends(store, keys=keys, alpha=alpha, min_size=min_size, min_change=min_change)


def render_text(found: list[Trend], points: bool = False) -> str:
    from pytest_distperf.store.history.text import render

    return render(found, points=points)


def _require_extra(option: str, *modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise HistoryError(f"{option}: the history needs {', '.join(missing)}: {EXTRA_HINT}")
