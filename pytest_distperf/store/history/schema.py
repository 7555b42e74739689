"""The history database's tables (SQLAlchemy Core, one definition for SQLite and PostgreSQL) and its format
version (HISTORY, the upgrade mechanism every file of the plugin goes through). The `distperf_` prefix lets a
team's shared PostgreSQL database hold them next to others.
"""

from __future__ import annotations

import datetime as _dt

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from pytest_distperf.errors import FileError
from pytest_distperf.fs.jsonio import VERSION_KEY, Format, FormatVersionError
from pytest_distperf.store.history.errors import HistoryError, SchemaVersionError

HISTORY = Format("history database")
# Any constant: the key of PostgreSQL's transaction-level advisory lock that serialises schema changes.
_PG_SCHEMA_LOCK = 0x64697374_70657266 & 0x7FFFFFFFFFFFFFFF


class UtcDateTime(sa.types.TypeDecorator):
    """Timestamps in UTC both ways: SQLite keeps naive text, PostgreSQL timestamptz; reads are always aware."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: _dt.datetime | None, dialect: sa.Dialect) -> _dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: the history stores aware UTC times")
        value = value.astimezone(_dt.timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: _dt.datetime | None, dialect: sa.Dialect) -> _dt.datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=_dt.timezone.utc) if value.tzinfo is None else value.astimezone(_dt.timezone.utc)


def _row_id() -> sa.types.TypeEngine:
    # BIGINT on PostgreSQL; SQLite auto-increments only an INTEGER PRIMARY KEY.
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


metadata = sa.MetaData()
format_version = sa.Table("distperf_format", metadata, sa.Column(VERSION_KEY, sa.Integer, nullable=False))

sessions = sa.Table(
    "distperf_sessions", metadata,
    sa.Column("id", _row_id(), primary_key=True, autoincrement=True),
    sa.Column("session_id", sa.String(64), nullable=False, unique=True),
    sa.Column("report_digest", sa.String(64), nullable=False, unique=True),
    sa.Column("created_at", UtcDateTime, nullable=False),
    sa.Column("recorded_at", UtcDateTime, nullable=False),
    sa.Column("git_commit", sa.String(64)),
    sa.Column("host", sa.Text),
    sa.Column("python", sa.String(32)),
    sa.Column("torch", sa.String(64)),
    sa.Column("deepspeed", sa.String(64)),
    sa.Column("cuda", sa.String(32)),
    sa.Column("environment", sa.Text, nullable=False),
)

measurements = sa.Table(
    "distperf_measurements", metadata,
    sa.Column("id", _row_id(), primary_key=True, autoincrement=True),
    sa.Column("session_pk", _row_id(), sa.ForeignKey("distperf_sessions.id", ondelete="CASCADE"), nullable=False),
    sa.Column("machine_class", sa.Text, nullable=False),
    sa.Column("test", sa.Text, nullable=False),
    sa.Column("job", sa.Text, nullable=False),
    sa.Column("metric", sa.Text, nullable=False),
    sa.Column("run_index", sa.Integer, nullable=False),
    sa.Column("value", sa.Float(53), nullable=False),
    sa.Column("unit", sa.String(16), nullable=False),
    sa.Column("direction", sa.String(8), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("config_hash", sa.String(64)),
    sa.Column("host_load", sa.Float(53)),
    sa.UniqueConstraint("session_pk", "machine_class", "test", "job", "metric", "run_index",
                        name="uq_distperf_measurement"),
    sa.Index("ix_distperf_measurements_series", "machine_class", "test", "job", "metric"),
)


def current_version(conn: Connection) -> int:
    """The database's format version; 0 for a database without the history's tables."""
    if not sa.inspect(conn).has_table(format_version.name):
        return 0
    return int(conn.execute(sa.select(format_version.c[VERSION_KEY])).scalar() or 0)


def check_version(conn: Connection, where: str) -> int:
    """The database's format version (0: no history tables yet) when this code reads it; writes nothing.
    SchemaVersionError for a newer database, HistoryError for a version that is not one."""
    found = current_version(conn)
    if found == 0:
        return found
    try:
        return HISTORY.check(found, where)
    except FormatVersionError as e:
        raise SchemaVersionError(str(e)) from None
    except FileError as e:
        raise HistoryError(str(e)) from None


def open_schema(conn: Connection, where: str) -> int:
    """Create the tables of a new database, or bring an older one up to date, inside the caller's transaction
    (serialised: SQLite's BEGIN IMMEDIATE, PostgreSQL's advisory lock); returns the version found (0: new).
    SchemaVersionError for a newer database, which is left untouched."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_SCHEMA_LOCK})
    found = check_version(conn, where)
    if found == 0:
        metadata.create_all(conn)
        conn.execute(format_version.insert().values({VERSION_KEY: HISTORY.version}))
        return found
    HISTORY.upgrade(found, conn, where)
    if found < HISTORY.version:
        conn.execute(format_version.update().values({VERSION_KEY: HISTORY.version}))
    return found
