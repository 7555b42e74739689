"""The history database: open it from a URL, append sessions, read series back.

Concurrent writers (xdist workers, CI runners) lose nothing: a session is one transaction, and the report's
digest is unique (the same report recorded twice is stored once). SQLite: BEGIN IMMEDIATE (two writers never
deadlock upgrading read locks), a busy timeout and retries with backoff, and the rollback journal (WAL needs
shared memory network file systems do not give). PostgreSQL: serialization failures and deadlocks are retried,
and schema changes hold an advisory lock.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from pytest_distperf.store.history import schema
from pytest_distperf.store.history.errors import HistoryError, HistoryUrlError
from pytest_distperf.store.history.ingest import Measurement, SessionRecord
from pytest_distperf.store.redact import redact_text

SQLITE_BUSY_TIMEOUT_S = 60.0
RETRY_ATTEMPTS = 8
DEFAULT_OPTION = "--distperf-history"
URL_FORMS = ("a file path, sqlite:///relative/path.db, sqlite:////absolute/path.db (four slashes) or "
             "postgresql://user:password@host:port/database")

T = TypeVar("T")


@dataclass(frozen=True)
class Recorded:
    """What `HistoryStore.record` did."""

    session_id: str
    rows: int  # measurements written (0 when duplicate)
    duplicate: bool  # the same report was recorded before, as `session_id`; nothing was written
    where: str  # the database, password hidden


@dataclass(frozen=True, order=True)
class SeriesKey:
    """One metric's series: what a trend is drawn for."""

    machine_class: str
    test: str
    job: str
    metric: str


@dataclass(frozen=True)
class SeriesRow:
    """One run-level value with its session (rows come oldest session first, runs in order)."""

    session_id: str
    created_at: _dt.datetime
    git_commit: str | None
    host: str | None
    torch: str | None
    deepspeed: str | None
    run_index: int
    value: float
    unit: str
    direction: str
    kind: str | None
    config_hash: str | None
    host_load: float | None
    # The session's tree differed from its commit (the report's environment.git_dirty); False where the report
    # did not say (written before it was recorded), as the commit alone was all it said.
    git_dirty: bool = False


def _dirty(environment: str | None) -> bool:
    """Whether a session's environment (its report's, as stored) says the tree held uncommitted changes: kept in
    the environment column, so the format needs no new column and no version step."""
    try:
        return json.loads(environment or "{}").get("git_dirty") is True
    except (ValueError, AttributeError):  # not an object: says nothing of the tree
        return False


def resolve_url(url: str, option: str = DEFAULT_OPTION) -> sa.URL:
    """A history URL -> SQLAlchemy URL: a bare path means SQLite; postgresql:// uses psycopg 3."""
    text = (url or "").strip()
    if not text:
        raise HistoryUrlError(f"{option}: empty URL; give {URL_FORMS}")
    if "://" not in text:
        return sa.URL.create("sqlite", database=os.path.abspath(os.path.expanduser(text)))
    try:
        parsed = sa.engine.make_url(text)
    except sa.exc.ArgumentError as e:
        raise HistoryUrlError(f"{option}: cannot parse the URL ({type(e).__name__}); give {URL_FORMS}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise HistoryUrlError(f"{option}: {text!r} is an in-memory SQLite database, which keeps nothing; "
                                  f"give a file: {URL_FORMS.partition(' or postgresql')[0]}")
        return parsed.set(drivername="sqlite", database=os.path.abspath(os.path.expanduser(parsed.database)))
    if backend in ("postgresql", "postgres"):
        driver = parsed.get_driver_name() if "+" in parsed.drivername else "psycopg"
        return parsed.set(drivername=f"postgresql+{driver}")
    raise HistoryUrlError(f"{option}: unsupported database {backend!r} in "
                          f"{redact_text(parsed.render_as_string(hide_password=False))!r}; give {URL_FORMS}")


class HistoryStore:
    """An open history database (brought to the current format on open)."""

    def __init__(self, url: str, option: str = DEFAULT_OPTION, create: bool = True, upgrade: bool = True):
        """`create`: a missing database (SQLite file, tables) is made, else HistoryError; `upgrade` False: only
        its format version is checked (check), nothing written."""
        self.option = option
        self.given = url
        self.url = resolve_url(url, option)
        self.where = redact_text(self.url.render_as_string(hide_password=False))  # the one redaction (redact.py)
        self.is_sqlite = self.url.get_backend_name() == "sqlite"
        if self.is_sqlite:
            self._prepare_sqlite_file(create)
        self.engine = self._engine()
        try:
            try:
                with self.engine.connect():
                    pass
            except sa.exc.DBAPIError as e:
                raise HistoryUrlError(f"{option}: cannot open {self.where}: {_first_line(e.orig)}") from None
            if not create and self._transaction(schema.current_version) == 0:
                raise HistoryError(f"{option}: {self.where} holds no distperf history (no "
                                   f"{schema.format_version.name} table)")
            opened = schema.open_schema if upgrade else schema.check_version
            self.found_version = self._transaction(lambda conn: opened(conn, f"{option}: {self.where}"))
        except BaseException:
            self.engine.dispose()
            raise

    @classmethod
    def check(cls, url: str, option: str = DEFAULT_OPTION) -> str:
        """Before a session's first job, the database it appends to at its end: it opens (a server answers),
        can be written, and holds no newer format. Creates, upgrades and keeps open nothing (the session opens
        it again at its end); returns where it is, password hidden."""
        resolved = resolve_url(url, option)
        if resolved.get_backend_name() == "sqlite":
            _check_file(resolved.database, option)  # the file, or the folder it will be created in (SQLite
            # also writes its journal beside it)
            if not os.path.exists(resolved.database) or os.path.getsize(resolved.database) == 0:
                return redact_text(resolved.render_as_string(hide_password=False))  # made at the end (opening an
                # empty file would already write SQLite's header)
        with cls(url, option, upgrade=False) as store:
            return store.where

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------------------------------
    def record(self, session: SessionRecord, rows: list[Measurement], session_id: str | None = None) -> Recorded:
        """Append one session and its measurements in one transaction."""
        sid = session_id or uuid.uuid4().hex
        if not 0 < len(sid) <= 64:
            raise HistoryError(f"{self.option}: session id {sid!r} must have 1 to 64 characters")

        def write(conn: Connection) -> Recorded:
            existing = self._session_with_digest(conn, session.report_digest)
            if existing is not None:
                return Recorded(existing, 0, True, self.where)
            env = session.environment
            pk = conn.execute(schema.sessions.insert().values(
                session_id=sid, report_digest=session.report_digest, created_at=session.created_at,
                recorded_at=_dt.datetime.now(_dt.timezone.utc), git_commit=session.git_commit, host=session.host,
                python=_str_or_none(env.get("python")), torch=_str_or_none(env.get("torch")),
                deepspeed=_str_or_none(env.get("deepspeed")), cuda=_str_or_none(env.get("cuda")),
                environment=json.dumps(env, sort_keys=True, default=repr),
            )).inserted_primary_key[0]
            if rows:
                conn.execute(schema.measurements.insert(), [
                    {"session_pk": pk, "machine_class": m.machine_class, "test": m.test, "job": m.job,
                     "metric": m.metric, "run_index": m.run_index, "value": m.value, "unit": m.unit,
                     "direction": m.direction, "kind": m.kind, "config_hash": m.config_hash,
                     "host_load": m.host_load} for m in rows])
            return Recorded(sid, len(rows), False, self.where)

        try:
            return self._transaction(write)
        except sa.exc.IntegrityError:
            # A concurrent writer recorded the same report first, or the given session id is taken.
            existing = self._transaction(lambda conn: self._session_with_digest(conn, session.report_digest))
            if existing is not None:
                return Recorded(existing, 0, True, self.where)
            raise HistoryError(f"{self.option}: session id {sid!r} is already recorded in {self.where} "
                               f"with another report") from None

    @staticmethod
    def _session_with_digest(conn: Connection, digest: str) -> str | None:
        return conn.execute(sa.select(schema.sessions.c.session_id)
                            .where(schema.sessions.c.report_digest == digest)).scalar()

    # -- reading ---------------------------------------------------------------------------------------------
    def series_keys(self) -> list[SeriesKey]:
        m = schema.measurements.c
        query = sa.select(m.machine_class, m.test, m.job, m.metric).distinct()
        return sorted(SeriesKey(*row) for row in self._transaction(lambda conn: conn.execute(query).all()))

    def series_rows(self, key: SeriesKey) -> list[SeriesRow]:
        s, m = schema.sessions.c, schema.measurements.c
        query = (sa.select(s.session_id, s.created_at, s.git_commit, s.host, s.torch, s.deepspeed, m.run_index,
                           m.value, m.unit, m.direction, m.kind, m.config_hash, m.host_load, s.environment)
                 .join_from(schema.measurements, schema.sessions, m.session_pk == s.id)
                 .where(m.machine_class == key.machine_class, m.test == key.test, m.job == key.job,
                        m.metric == key.metric)
                 .order_by(s.created_at, s.id, m.run_index))
        return [SeriesRow(*row[:-1], git_dirty=_dirty(row[-1]))
                for row in self._transaction(lambda conn: conn.execute(query).all())]

    def count(self, table: sa.Table) -> int:
        return int(self._transaction(lambda conn: conn.execute(sa.select(sa.func.count()).select_from(table))
                                     .scalar()))

    # -- plumbing --------------------------------------------------------------------------------------------
    def _prepare_sqlite_file(self, create: bool) -> None:
        path = self.url.database
        if os.path.lexists(path) and not os.path.isfile(path):  # a folder: check's words, not SQLite's "unable to
            _check_file(path, self.option)  # open database file"
        if not create and not os.path.exists(path):
            raise HistoryError(f"{self.option}: no history database at {path}{relative_hint(self.given)}")
        parent = os.path.dirname(path)
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as e:
            raise HistoryUrlError(f"{self.option}: cannot create the folder of {path}: {e}") from None

    def _engine(self) -> Engine:
        try:
            if self.is_sqlite:
                engine = sa.create_engine(self.url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
                sa.event.listen(engine, "connect", _sqlite_on_connect)
                sa.event.listen(engine, "begin", _sqlite_on_begin)
                return engine
            return sa.create_engine(self.url, pool_pre_ping=True)
        except (ImportError, sa.exc.NoSuchModuleError) as e:
            raise HistoryUrlError(f"{self.option}: {self.where} needs a driver that is not installed ({e}); "
                                  f"install pytest-distperf[history]") from None

    def _transaction(self, work: Callable[[Connection], T]) -> T:
        """Run `work` in one transaction, retrying it when the database is busy or a transaction must restart."""
        for attempt in range(RETRY_ATTEMPTS):
            try:
                with self.engine.begin() as conn:
                    return work(conn)
            except sa.exc.DBAPIError as e:
                if _retryable(e) and attempt + 1 < RETRY_ATTEMPTS:
                    time.sleep(min(2.0, 0.05 * 2 ** attempt) * (0.5 + random.random()))
                    continue
                if isinstance(e, sa.exc.IntegrityError):
                    raise
                raise HistoryError(f"{self.option}: {self.where}: {_first_line(e.orig)}") from e
        raise AssertionError("unreachable")


def relative_hint(url: str) -> str:
    """For sqlite:///x/y.db (SQLAlchemy's relative form, three slashes), what the user may have meant: the
    absolute /x/y.db takes four slashes. '' for any other URL."""
    text = (url or "").strip()
    if not text.startswith("sqlite:///") or text.startswith("sqlite:////"):
        return ""
    rest = text[len("sqlite:///"):]
    return (f" (sqlite:///{rest} names {rest} relative to the current folder; the absolute /{rest} is "
            f"sqlite:////{rest}, four slashes, or the plain path /{rest})")


def _check_file(path: str, option: str) -> None:
    """outputs.check_file's check and words for a SQLite file ('... is a folder; give a file path'), as a
    HistoryUrlError: for the database a session appends to, and for one that is read."""
    from pytest_distperf.store.outputs import OutputPathError, check_file

    try:
        check_file(path, option)
    except OutputPathError as e:
        raise HistoryUrlError(str(e)) from None


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Transactions are begun explicitly (below), not by the sqlite3 module's implicit BEGIN.
    dbapi_connection.isolation_level = None
    dbapi_connection.execute("PRAGMA foreign_keys = ON")


def _sqlite_on_begin(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _retryable(e: sa.exc.DBAPIError) -> bool:
    text = str(e.orig).lower()
    if "database is locked" in text or "database is busy" in text:
        return True
    return getattr(e.orig, "sqlstate", None) in ("40001", "40P01")


def _first_line(error: Any) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _str_or_none(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None
