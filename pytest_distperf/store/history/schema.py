"""The history database's tables (SQLAlchemy Core, one definition for SQLite and PostgreSQL) and the migration
steps that bring any older database to `SCHEMA_VERSION`.

Tables carry a `distperf_` prefix so that a team's shared PostgreSQL database can hold them next to others.

- `distperf_schema_version`: one row per applied migration step (version, applied_at); the highest is the
  database's version.
- `distperf_sessions`: one row per recorded pytest session: its `session_id` (unique), the SHA-256 of the report
  document (unique: the same report recorded twice is one session), when the session ended (`created_at`) and
  when it was recorded, the commit, host and versions (torch, deepspeed, python, cuda) and the whole environment
  as JSON.
- `distperf_measurements`: one row per (session, machine class, test, job, metric, run): the run-level value
  with its unit and direction ('lower' or 'higher' is better), the metric's kind (time | memory | count) and the
  job's configuration hash, and the other load on the host's cores while that run was timed (the report's
  `host_other_load_cores`: a noisy session shows as one). `comms_scope` says what a `comms.*` value covers:
  `COMMS_PER_RANK` (the rank with the most, the gate's definition) for rows recorded since version 4; NULL on
  `comms.*` rows recorded before, which hold calls and bytes per step summed over ranks. Those rows are kept as
  they were and read as series of their own (store.SUMMED_SUFFIX), never mixed with the per-rank values.

A migration step is a function of an open connection inside the migrating transaction; `migrate` runs the
missing ones in order and records each. A database newer than this code is refused, never touched.
"""

from __future__ import annotations

import datetime as _dt
from typing import Callable

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from pytest_distperf.store.history.errors import SchemaVersionError

SCHEMA_VERSION = 4
COMMS_PER_RANK = "rank_max"  # comms_scope of comms.* rows: per step, per rank (the rank with the most)
# Any constant: the key of PostgreSQL's transaction-level advisory lock that serialises migrations.
_PG_MIGRATION_LOCK = 0x64697374_70657266 & 0x7FFFFFFFFFFFFFFF


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


# -- columns (shared by the current tables and the migration steps that created them) ---------------------------
def _session_columns() -> list[sa.Column]:
    return [
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
    ]


def _measurement_v1_columns() -> list[sa.SchemaItem]:
    return [
        sa.Column("id", _row_id(), primary_key=True, autoincrement=True),
        sa.Column("session_pk", _row_id(), sa.ForeignKey("distperf_sessions.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("machine_class", sa.Text, nullable=False),
        sa.Column("test", sa.Text, nullable=False),
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("metric", sa.Text, nullable=False),
        sa.Column("run_index", sa.Integer, nullable=False),
        sa.Column("value", sa.Float(53), nullable=False),
        sa.Column("unit", sa.String(16), nullable=False),
        sa.Column("direction", sa.String(8), nullable=False),
        sa.UniqueConstraint("session_pk", "machine_class", "test", "job", "metric", "run_index",
                            name="uq_distperf_measurement"),
    ]


def _schema_version_columns() -> list[sa.Column]:
    return [sa.Column("version", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("applied_at", UtcDateTime, nullable=False)]


# -- the current schema (what the code reads and writes) ---------------------------------------------------------
metadata = sa.MetaData()
schema_version = sa.Table("distperf_schema_version", metadata, *_schema_version_columns())
sessions = sa.Table("distperf_sessions", metadata, *_session_columns())

measurements = sa.Table(
    "distperf_measurements", metadata,
    *_measurement_v1_columns(),
    sa.Column("kind", sa.String(16)),  # since version 2
    sa.Column("config_hash", sa.String(64)),  # since version 2
    sa.Column("host_load", sa.Float(53)),  # since version 3
    sa.Column("comms_scope", sa.String(16)),  # since version 4
    sa.Index("ix_distperf_measurements_series", "machine_class", "test", "job", "metric"),  # since version 2
)


# -- migration steps ---------------------------------------------------------------------------------------------
def _v1_create_tables(conn: Connection) -> None:
    """Version 1: sessions and run-level measurements (no kind, no configuration hash, no series index)."""
    v1 = sa.MetaData()
    sa.Table("distperf_schema_version", v1, *_schema_version_columns())
    sa.Table("distperf_sessions", v1, *_session_columns())
    sa.Table("distperf_measurements", v1, *_measurement_v1_columns())
    v1.create_all(conn)


def _v2_kind_config_hash_index(conn: Connection) -> None:
    """Version 2: each measurement's metric kind (back-filled from its name) and job configuration hash, and an
    index on the series key that the trend queries use."""
    from pytest_distperf.measure.figures import metric_traits

    for name in ("kind", "config_hash"):
        _add_column(conn, name)
    table = sa.Table("distperf_measurements", sa.MetaData(), autoload_with=conn)
    for (metric,) in conn.execute(sa.select(table.c.metric).distinct()):
        conn.execute(table.update().where(table.c.metric == metric).values(kind=metric_traits(metric)[2]))
    sa.Index("ix_distperf_measurements_series", table.c.machine_class, table.c.test, table.c.job,
             table.c.metric).create(conn)


def _v3_host_load(conn: Connection) -> None:
    """Version 3: the other load on the host's cores during each run (NULL for rows recorded before)."""
    _add_column(conn, "host_load")


def _v4_comms_scope(conn: Connection) -> None:
    """Version 4: what a comms.* row's value covers. Rows recorded before keep NULL: their calls and bytes per step
    were summed over ranks, and a sum cannot be split back into the busiest rank's share, so no stored value is
    changed; they stay readable as series of their own."""
    _add_column(conn, "comms_scope")


def comms_scope(metric: str) -> str | None:
    """The comms_scope this code records a metric with."""
    return COMMS_PER_RANK if metric.startswith("comms.") else None


def _add_column(conn: Connection, name: str) -> None:
    column = measurements.c[name]
    conn.execute(sa.text(f"ALTER TABLE {measurements.name} ADD COLUMN {name} "
                         f"{column.type.compile(dialect=conn.dialect)}"))


MIGRATIONS: dict[int, Callable[[Connection], None]] = {
    1: _v1_create_tables,
    2: _v2_kind_config_hash_index,
    3: _v3_host_load,
    4: _v4_comms_scope,
}
assert sorted(MIGRATIONS) == list(range(1, SCHEMA_VERSION + 1))


def current_version(conn: Connection) -> int:
    """The database's schema version; 0 for a database without the history's tables."""
    if not sa.inspect(conn).has_table(schema_version.name):
        return 0
    return int(conn.execute(sa.select(sa.func.max(schema_version.c.version))).scalar() or 0)


def migrate(conn: Connection, where: str, target: int = SCHEMA_VERSION) -> tuple[int, int]:
    """Bring the database up to `target` inside the caller's transaction; returns (from, to).

    Concurrent callers are serialised (SQLite: the caller's BEGIN IMMEDIATE; PostgreSQL: an advisory lock held
    to the end of the transaction), so each step runs once. `where` names the database in errors."""
    if conn.dialect.name == "postgresql":
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
    found = current_version(conn)
    if found > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where}: history schema version {found} is newer than this pytest-distperf's ({SCHEMA_VERSION}); "
            f"upgrade pytest-distperf to read or write it (the database was left untouched)")
    for version in range(found + 1, target + 1):
        MIGRATIONS[version](conn)
        conn.execute(schema_version.insert().values(version=version, applied_at=_dt.datetime.now(_dt.timezone.utc)))
    return found, max(found, target)
