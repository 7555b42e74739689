"""History of every session's results in a database, and the step changes in it: the functions other modules call.

Needs the `history` extra (SQLAlchemy, psycopg 3, ruptures); this `__init__` imports none of them, so importing
it is cheap and a missing extra gets our error. Every error is a `HistoryError` whose message starts with `option`.
"""

from __future__ import annotations

import copy
import importlib.util
from typing import TYPE_CHECKING, Any

from pytest_distperf.store.history.errors import HistoryError, HistoryUrlError, ReportDocumentError, SchemaVersionError
from pytest_distperf.store.history.ingest import read_report
from pytest_distperf.store.history.trend import Trend, build_trends
from pytest_distperf.store.redact import redact, redact_text

if TYPE_CHECKING:
    from pytest_distperf.store.history.store import Recorded

__all__ = ["HistoryError", "HistoryUrlError", "ReportDocumentError", "SchemaVersionError", "check_target",
           "check_url", "database_file", "record_session", "session_trends", "trends"]

EXTRA_HINT = 'pip install "pytest-distperf[history]"'


def record_session(url: str, report_doc: dict[str, Any], *, session_id: str | None = None,
                   commit: str | None = None, option: str = "--distperf-history") -> Recorded:
    """Append one session's `--distperf-json` document to the history at `url` (a file path, sqlite:// or
    postgresql://); `commit` overrides the report's. The same document twice is stored once."""
    _require_extra(option, "sqlalchemy")
    from pytest_distperf.store.history.store import HistoryStore

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

    return redact_text(resolve_url(url, option).render_as_string(hide_password=False))  # the one redaction


def check_target(url: str, option: str = "--distperf-history") -> str:
    """Before the first job, the database the session appends to at its end: the URL's form, and that it opens,
    can be written and holds a format this code reads (HistoryStore.check); nothing created or kept open."""
    _require_extra(option, "sqlalchemy")
    from pytest_distperf.store.history.store import HistoryStore

    return HistoryStore.check(url, option)


def database_file(url: str, option: str = "--distperf-history") -> str | None:
    """The file a SQLite history URL names (None for a server): no report may be written over it."""
    _require_extra(option, "sqlalchemy")
    from pytest_distperf.store.history.store import resolve_url

    resolved = resolve_url(url, option)
    return resolved.database if resolved.get_backend_name() == "sqlite" else None


def trends(url: str, *, test: str | None = None, job: str | None = None, metric: str | None = None,
           machine_class: str | None = None, alpha: float = 0.001, min_size: int = 3, min_change: float = 0.0,
           option: str = "history URL") -> list[Trend]:
    """One `Trend` per series whose fields contain the given substrings; the database must exist."""
    _require_extra(option, "sqlalchemy", "ruptures", "scipy")
    from pytest_distperf.store.history.store import HistoryStore

    with HistoryStore(url, option=option, create=False) as store:
        return build_trends(store, test=test, job=job, metric=metric, machine_class=machine_class, alpha=alpha,
                            min_size=min_size, min_change=min_change)


def session_trends(url: str, report_doc: dict[str, Any], *, alpha: float = 0.001, min_size: int = 3,
                   min_change: float = 0.0, option: str = "--distperf-history") -> list[Trend]:
    """The trends of exactly the series this report document measured (e.g. for its HTML report)."""
    _require_extra(option, "sqlalchemy", "ruptures", "scipy")
    from pytest_distperf.store.history.store import HistoryStore, SeriesKey

    _session, rows = read_report(report_doc, f"{option}: the session's report")
    keys = {SeriesKey(r.machine_class, r.test, r.job, r.metric) for r in rows}
    with HistoryStore(url, option=option, create=False) as store:
        return build_trends(store, keys=keys, alpha=alpha, min_size=min_size, min_change=min_change)


def _require_extra(option: str, *modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise HistoryError(f"{option}: the history needs {', '.join(missing)}: {EXTRA_HINT}")
