"""The history store (SQLite and a real PostgreSQL server), its format version, concurrent writers, the change-point
search and the `python -m pytest_distperf history` command.

PostgreSQL: DISTPERF_TEST_POSTGRES_URL (`.ci/services/postgres.sh start` prints it); without it the PostgreSQL
cases skip, except under CI=true, where they fail. Each PostgreSQL case works in a schema of its own.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import os
import random
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

# Without the history extra every test here skips; a skip of the whole module would be reported under any -m
# selection (README's main job, `-m zero3`, collects tests/ too), a test's own skip only where it is selected.
try:
    import ruptures  # noqa: F401
    import sqlalchemy as sa

    from pytest_distperf.store.history import (HistoryError, HistoryUrlError, ReportDocumentError,
                                               SchemaVersionError, record_session, trends)
    from pytest_distperf.store.history import schema
    from pytest_distperf.store.history.changepoints import find_splits, strongest_split
    from pytest_distperf.store.history.ingest import read_report
    from pytest_distperf.store.history.store import HistoryStore
    NO_EXTRA = ""
except ImportError:
    NO_EXTRA = "the history extra is not installed (pytest-distperf[history])"
pytestmark = pytest.mark.skipif(bool(NO_EXTRA), reason=NO_EXTRA)

# A real `--distperf-json` document: perf_tests/test_zero3.py (two tests, ZeRO-3 and FSDP2, 3 runs each) on the
# 2-core CPU box; paths made relative.
REPORT = os.path.join(os.path.dirname(__file__), "data", "history_report_zero3_cpu.json")
# A real probed one: test_comm.py's all-gather count check (comms probe on gloo, one run per job), recorded with
# `pytest perf_tests/test_comm.py --distperf -k all_gathers --distperf-json=report.json`; paths made relative.
# Its collectives are per step, per rank (the rank with the most).
REPORT_COMMS = os.path.join(os.path.dirname(__file__), "data", "history_report_comm_cpu.json")
POSTGRES_ENV = "DISTPERF_TEST_POSTGRES_URL"


def load(path: str = REPORT) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# -- databases ---------------------------------------------------------------------------------------------------
def postgres_server_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        reason = f"{POSTGRES_ENV} is not set (start a server: .ci/services/postgres.sh start)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but {reason}")
        pytest.skip(reason)
    return url


@pytest.fixture
def postgres_url():
    """A URL whose tables land in a fresh schema (search_path), dropped afterwards."""
    import psycopg

    server = postgres_server_url()
    name = f"distperf_t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    sep = "&" if "?" in server else "?"
    yield f"{server}{sep}options=-csearch_path%3D{name}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {name} CASCADE")


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'history.db'}"
    return request.getfixturevalue("postgres_url")


def session_doc(base: dict, when: _dt.datetime, commit: str, step_scale: float = 1.0,
                memory_scale: float = 1.0) -> dict:
    """`base` as another session: its time and commit, step times and peak memory scaled."""
    doc = copy.deepcopy(base)
    doc["created_at"] = when.isoformat()
    doc["environment"]["git_commit"] = commit
    for test in doc["tests"]:
        test["environment"] = doc["environment"]
        for job in test["jobs"]:
            for run in job["runs"]:
                run["step_times"] = [t * step_scale for t in run["step_times"]]
                run["peak_memory"] = int(run["peak_memory"] * memory_scale)
                run["figures"]["step_time"] *= step_scale
                run["figures"]["peak_memory"] *= memory_scale
    return doc


def commit_id(i: int) -> str:
    return f"{i:04d}" + uuid.uuid5(uuid.NAMESPACE_OID, str(i)).hex[:36]


# -- the report document -------------------------------------------------------------------------------------
def test_rows_from_a_real_report_match_the_gates_values():
    doc = load()
    session, rows = read_report(doc)
    jobs = {(t["nodeid"], j["label"]): len(j["runs"]) for t in doc["tests"] for j in t["jobs"]}
    # step_time, peak_memory, optimizer_state_bytes: one row per run of every job of every test
    assert len(rows) == 3 * sum(jobs.values())
    assert session.created_at == _dt.datetime.fromisoformat(doc["created_at"])
    assert {r.machine_class for r in rows} == {t["machine_class"] for t in doc["tests"]}
    # The median of the rows of a (test, job, metric) is the gate's own current value, unit and direction.
    import statistics

    for test in doc["tests"]:
        for v in test["verdicts"]:
            mine = [r for r in rows if (r.test, r.job, r.metric) == (test["nodeid"], v["job"], v["metric"])]
            assert statistics.median(r.value for r in mine) == pytest.approx(v["current"], rel=1e-12)
            assert {(r.unit, r.direction, r.kind) for r in mine} == {(v["unit"], v["direction"], v["metric_kind"])}
    # each run's other host load goes with each of its values
    job = doc["tests"][0]["jobs"][0]
    assert [r.host_load for r in rows if (r.test, r.job, r.metric) == (doc["tests"][0]["nodeid"], job["label"],
                                                                      "step_time")] == \
        [run["host_other_load_cores"] for run in job["runs"]]


def test_comms_rows_from_a_real_probed_report_match_the_gates_values():
    doc = load(REPORT_COMMS)
    _session, rows = read_report(doc)
    import statistics

    checked = 0
    for test in doc["tests"]:
        for v in test["verdicts"]:
            mine = [r.value for r in rows if (r.test, r.job, r.metric) == (test["nodeid"], v["job"], v["metric"])]
            assert mine, v
            assert statistics.median(mine) == pytest.approx(v["current"], rel=1e-12)
            checked += v["metric"].startswith("comms.")
    assert checked > 0
    # per step, per rank (the rank with the most), as the probe table shows it: never summed over ranks
    for test in doc["tests"]:
        for job in test["jobs"]:
            [probe] = [p for p in test["probes"] if p["label"] == job["label"]]
            ranks = [k["probes"] for k in job["runs"][0]["ranks"]]
            assert len(ranks) == 2
            for kind in ("all_gather", "reduce_scatter"):
                [calls] = [r.value for r in rows if (r.test, r.job, r.metric, r.run_index) ==
                           (test["nodeid"], job["label"], f"comms.{kind}.calls_per_step", 0)]
                assert calls == max(k[f"comms.{kind}.per_step"] for k in ranks) == \
                    probe["metrics"][f"comms.{kind}.per_step"]
                assert calls < sum(k[f"comms.{kind}.per_step"] for k in ranks)


@pytest.mark.parametrize("mutate,needle", [
    (lambda d: d.pop("tests"), "'tests'"),
    (lambda d: d.update(created_at="yesterday"), "'created_at'"),
    (lambda d: d["tests"][0].pop("machine_class"), "machine_class"),
    (lambda d: d["tests"][0]["jobs"][0]["runs"][0]["figures"].update(step_time="fast"), "runs[0]"),
    (lambda d: d.update(format_version=2), "JSON report format version 2 is newer than the version 1"),
])
def test_a_bad_report_document_is_an_error_naming_the_field(tmp_path, mutate, needle):
    doc = load()
    mutate(doc)
    db = tmp_path / "h.db"
    with pytest.raises(ReportDocumentError, match="--distperf-history") as info:
        record_session(str(db), doc)
    assert needle in str(info.value)
    assert not db.exists()  # nothing was opened, nothing half-written


# -- recording ---------------------------------------------------------------------------------------------------
def test_record_session_appends_every_job_and_metric(url):
    doc = load()
    _session, rows = read_report(doc)
    first = record_session(url, doc, commit="c" * 40)
    assert (first.rows, first.duplicate) == (len(rows), False)
    again = record_session(url, doc, commit="c" * 40)  # the same document: stored once
    assert (again.session_id, again.rows, again.duplicate) == (first.session_id, 0, True)
    later = session_doc(doc, _dt.datetime.fromisoformat(doc["created_at"]) + _dt.timedelta(hours=1), "d" * 40)
    second = record_session(url, later, session_id="my-session-2")
    assert (second.session_id, second.duplicate) == ("my-session-2", False)
    found = trends(url, metric="step_time")
    assert len(found) == len({(r.test, r.job) for r in rows if r.metric == "step_time"})
    for t in found:
        assert [p.git_commit for p in t.points] == ["c" * 40, "d" * 40]
        assert [len(p.runs) for p in t.points] == [3, 3]
        assert t.points[0].torch == doc["environment"]["torch"]
    with HistoryStore(url) as store:
        assert store.count(schema.measurements) == 2 * len(rows)
        assert store.count(schema.sessions) == 2


def test_a_session_id_taken_by_another_report_is_refused(url):
    doc = load()
    record_session(url, doc, session_id="same")
    other = session_doc(doc, _dt.datetime.now(_dt.timezone.utc), "e" * 40)
    with pytest.raises(HistoryError, match="session id 'same' is already recorded"):
        record_session(url, other, session_id="same")


@pytest.mark.parametrize("bad", ["mysql://user@host/db", "", "sqlite://", "sqlite:///:memory:", "http://x/y"])
def test_a_bad_url_is_an_error_naming_the_option(tmp_path, bad):
    with pytest.raises(HistoryUrlError, match="^--distperf-history: ") as info:
        record_session(bad, load())
    assert "sqlite:////absolute/path.db (four slashes)" in str(info.value)


def test_check_url_checks_the_form_without_opening_anything(tmp_path):
    from pytest_distperf.store.history import check_url

    assert check_url(str(tmp_path / "h.db")) == f"sqlite:///{tmp_path / 'h.db'}"
    assert check_url("postgresql://me:pw@db.example:5432/perf") == "postgresql+psycopg://me:***@db.example:5432/perf"
    with pytest.raises(HistoryUrlError, match="^--distperf-history: unsupported database 'ftp'"):
        check_url("ftp://host/file")
    assert not (tmp_path / "h.db").exists()


def test_an_unreachable_postgresql_server_is_an_error_naming_the_option_without_the_password():
    with pytest.raises(HistoryUrlError, match="^--distperf-history: cannot open postgresql") as info:
        record_session("postgresql://someone:s3cret@127.0.0.1:1/nothing", load())
    assert "s3cret" not in str(info.value)


def test_reading_a_missing_sqlite_file_is_an_error_and_creates_nothing(tmp_path):
    path = tmp_path / "none.db"
    with pytest.raises(HistoryError, match="no history database at"):
        trends(str(path))
    assert not path.exists()


# -- format version ----------------------------------------------------------------------------------------------
def _format_rows(url: str) -> list[int]:
    engine = sa.create_engine(_engine_url(url))
    with engine.connect() as conn:
        rows = conn.execute(sa.select(schema.format_version.c.format_version)).scalars().all()
    engine.dispose()
    return rows


def test_an_older_database_is_brought_up_to_date_by_its_update_steps_once(url, monkeypatch):
    """The one upgrade mechanism (fs/jsonio.Format), here with a fake update_to_2 that adds a column."""
    recorded = record_session(url, load())
    ran = []

    def update_to_2(conn):
        ran.append(1)
        conn.execute(sa.text("ALTER TABLE distperf_sessions ADD COLUMN note TEXT"))
        return conn

    monkeypatch.setattr(schema.HISTORY, "version", 2)
    monkeypatch.setattr(schema.HISTORY, "updates", {2: update_to_2})
    with HistoryStore(url) as store:
        assert store.found_version == 1
        assert store.count(schema.measurements) == recorded.rows  # nothing dropped
    with HistoryStore(url) as store:  # opening again runs no step
        assert store.found_version == 2
    assert ran == [1] and _format_rows(url) == [2]


def test_a_fresh_database_has_exactly_the_current_schema(url):
    with HistoryStore(url) as store:
        assert store.found_version == 0
        with store.engine.connect() as conn:
            inspector = sa.inspect(conn)
            for table in schema.metadata.sorted_tables:
                assert {c["name"] for c in inspector.get_columns(table.name)} == set(table.c.keys())
    with HistoryStore(url) as store:  # opening again changes nothing
        assert store.found_version == schema.HISTORY.version == 1
    assert _format_rows(url) == [1]


def test_a_newer_database_is_refused_and_left_untouched(url):
    with HistoryStore(url) as store:
        with store.engine.begin() as conn:
            conn.execute(schema.format_version.update().values(format_version=schema.HISTORY.version + 1))
    with pytest.raises(SchemaVersionError, match=f"history database format version {schema.HISTORY.version + 1} "
                                                 f"is newer than the version {schema.HISTORY.version}"):
        record_session(url, load())
    engine = sa.create_engine(_engine_url(url))
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(schema.sessions)).scalar() == 0
        assert schema.current_version(conn) == schema.HISTORY.version + 1
    engine.dispose()


def _engine_url(url: str) -> sa.URL:
    from pytest_distperf.store.history.store import resolve_url

    return resolve_url(url)


# -- concurrent writers ------------------------------------------------------------------------------------------
WRITER = textwrap.dedent("""
    import copy, datetime, json, os, sys, time
    from pytest_distperf.store.history import record_session
    url, report, go, writer, sessions = sys.argv[1:6]
    doc = json.load(open(report))
    while not os.path.exists(go):
        time.sleep(0.005)
    for i in range(int(sessions)):
        d = copy.deepcopy(doc)
        d["created_at"] = (datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc)
                           + datetime.timedelta(minutes=int(writer) * 1000 + i)).isoformat()
        d["environment"]["git_commit"] = f"{writer}-{i}"
        r = record_session(url, d)
        assert not r.duplicate and r.rows > 0, r
    print("ok")
""")


def test_concurrent_writer_processes_lose_no_row(url, tmp_path):
    """N processes start together on a fresh database (so its creation races too), each appending M sessions."""
    writers, per_writer = 4, 5
    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, url, REPORT, str(go), str(w), str(per_writer)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(writers)]
    time.sleep(1.0)  # let every interpreter reach the start line
    go.touch()
    results = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0 and out.strip() == "ok", err[-2000:]
    rows_per_session = len(read_report(load())[1])
    with HistoryStore(url) as store:
        assert store.count(schema.sessions) == writers * per_writer
        assert store.count(schema.measurements) == writers * per_writer * rows_per_session
        with store.engine.connect() as conn:
            commits = conn.execute(sa.select(schema.sessions.c.git_commit)).scalars().all()
    assert sorted(commits) == sorted(f"{w}-{i}" for w in range(writers) for i in range(per_writer))
    assert _format_rows(url) == [schema.HISTORY.version]  # the database was created once


# -- change points -----------------------------------------------------------------------------------------------
def test_a_step_change_in_24_sessions_is_found_at_its_commit_range(url):
    """24 sessions from the real report, step times +15 % from session 14 on, every session's runs scaled by
    its own noise (2 % sd); peak memory noisy but unchanged."""
    base, rng = load(), random.Random(19)
    start = _dt.datetime(2026, 11, 1, tzinfo=_dt.timezone.utc)
    step_at, sessions = 14, 24
    for i in range(sessions):
        scale = (1.15 if i >= step_at else 1.0) * rng.gauss(1.0, 0.02)
        record_session(url, session_doc(base, start + _dt.timedelta(hours=i), commit_id(i), step_scale=scale,
                                        memory_scale=rng.gauss(1.0, 0.01)))
    found = trends(url, job="fsdp2", test="trains_like")
    by_metric = {t.key.metric: t for t in found}
    step = by_metric["step_time"]
    assert len(step.points) == sessions
    assert len(step.change_points) == 1
    cp = step.change_points[0]
    assert cp.index == step_at
    assert (cp.before.git_commit, cp.after.git_commit) == (commit_id(step_at - 1), commit_id(step_at))
    assert cp.commit_range == f"{commit_id(step_at - 1)[:12]}..{commit_id(step_at)[:12]}"
    assert cp.verdict == "regression" and cp.pvalue <= 0.001
    assert 0.10 < cp.change < 0.20
    assert not cp.config_changed and cp.environment_changes == ()
    assert by_metric["peak_memory"].change_points == ()
    assert by_metric["peak_memory"].strongest.pvalue > 0.001  # what did not hold is said, with its p-value
    assert by_metric["optimizer_state_bytes"].change_points == ()  # constant: no change, no t-test noise


def test_session_trends_are_the_series_of_that_report(tmp_path):
    from pytest_distperf.report.charts import trend_series
    from pytest_distperf.store.history import session_trends

    db, zero3, comm = str(tmp_path / "h.db"), load(), load(REPORT_COMMS)
    record_session(db, zero3)
    record_session(db, comm)
    found = session_trends(db, comm)
    assert {(t.key.test, t.key.job, t.key.metric) for t in found} == {
        (r.test, r.job, r.metric) for r in read_report(comm)[1]}
    assert all(len(t.points) == 1 for t in found)
    series = trend_series(found)  # the HTML report's own input type
    assert [(s.test, s.job, s.metric, s.unit) for s in series] == [
        (t.key.test, t.key.job, t.key.metric, t.unit) for t in found]


def test_find_splits_on_plain_series():
    rng = random.Random(7)
    flat = [rng.gauss(100, 2) for _ in range(40)]
    assert find_splits(flat) == []
    steps = [rng.gauss(100, 2) for _ in range(10)] + [rng.gauss(120, 2) for _ in range(10)] + \
            [rng.gauss(105, 2) for _ in range(10)]
    assert [s.index for s in find_splits(steps)] == [10, 20]
    exact = [4.0] * 8 + [6.0] * 8  # exact counts: a change with no noise at all
    [split] = find_splits(exact)
    assert (split.index, split.pvalue, split.change) == (8, 0.0, 0.5)
    assert find_splits([4.0] * 16) == []
    noisy = [rng.gauss(100, 30) for _ in range(10)] + [rng.gauss(115, 30) for _ in range(10)]
    assert find_splits(noisy) == [] and strongest_split(noisy).pvalue > 0.001
    assert find_splits([1.0, 2.0, 3.0, 4.0, 5.0]) == []  # fewer than 2 x min_size sessions
    assert find_splits(steps, min_change=0.5) == []  # smaller steps than asked for
    with pytest.raises(ValueError, match="min_size"):
        find_splits(steps, min_size=1)


# -- the plugin's option -----------------------------------------------------------------------------------------
PERF_TEST = """
import pytest

@pytest.mark.distperf(world_size=2)
def test_ddp(distperf):
    distperf.measure("ddp", repeats=2, steps=3, warmup=1)
"""


@pytest.mark.slow
def test_distperf_history_records_a_real_session(pytester: pytest.Pytester):
    """A real 2-rank CPU session with --distperf-history: its jobs land in the history at the end."""
    pytester.makepyfile(test_perf=PERF_TEST)
    db = pytester.path / "out" / "history.db"
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", f"--distperf-history={db}")
    result.assert_outcomes(passed=1)
    # 2 runs x (step time, peak memory, optimizer state, training-state memory), and the exact counts (FLOPs,
    # operators) once: a job's later runs leave out the counting pass (rank/work.py)
    result.stdout.fnmatch_lines(["*distperf: wrote history: session * (10 values) in sqlite:///*history.db"])
    found = trends(str(db))
    assert sorted(t.key.metric for t in found) == ["aten_ops_per_step", "flops_per_step", "optimizer_state_bytes",
                                                   "peak_memory", "step_time", "train_memory"]
    counted_once = ("aten_ops_per_step", "flops_per_step")
    assert all(t.key.test == "test_perf.py::test_ddp" and len(t.points) == 1
               and len(t.points[0].runs) == (1 if t.key.metric in counted_once else 2) for t in found)


def test_a_bad_distperf_history_url_stops_the_session_before_any_job(pytester: pytest.Pytester):
    pytester.makepyfile(test_perf=PERF_TEST)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "--distperf-history=mysql://u:pw@h/d")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*distperf: --distperf-history: unsupported database 'mysql'*"])
    assert "pw@" not in result.stderr.str()


# -- the command line --------------------------------------------------------------------------------------------
def test_history_command_prints_the_trend_and_the_change_point(tmp_path):
    db = tmp_path / "history.db"
    base, rng = load(), random.Random(3)
    start = _dt.datetime(2026, 11, 1, tzinfo=_dt.timezone.utc)
    for i in range(20):
        scale = (0.8 if i >= 8 else 1.0) * rng.gauss(1.0, 0.02)
        record_session(str(db), session_doc(base, start + _dt.timedelta(hours=i), commit_id(i), step_scale=scale))
    html, out_json = tmp_path / "trend.html", tmp_path / "trend.json"
    cmd = [sys.executable, "-m", "pytest_distperf", "history", f"sqlite:///{db}", "--metric", "step_time",
           "--job", "deepspeed", "--test", "trains_like", "--points", "--html", str(html), "--json", str(out_json)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"improvement between commit {commit_id(7)[:12]}" in done.stdout
    assert f"and {commit_id(8)[:12]}" in done.stdout
    assert "1 series, 1 change point(s)" in done.stdout
    page = html.read_text()
    assert page.startswith("<!") and "<svg" in page and commit_id(7)[:12] in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
    [trend] = json.loads(out_json.read_text())["trends"]
    assert trend["change_points"][0]["commit_range"] == f"{commit_id(7)[:12]}..{commit_id(8)[:12]}"

    bad = subprocess.run([sys.executable, "-m", "pytest_distperf", "history", "mysql://u:pw@h/d"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "history URL: unsupported database 'mysql'" in bad.stderr
    assert "pw@" not in bad.stderr


# -- the history target, checked before the first job -------------------------------------------------------------
NO_JOB = """
import pytest

@pytest.mark.distperf(world_size=2)
def test_x(distperf):
    raise AssertionError("a job would have started here")
"""


def _bad_sqlite_target(tmp_path, case: str) -> tuple[str, str]:
    """(path, what the error says) of a --distperf-history SQLite target the session could not append to."""
    db = tmp_path / "hist.db"
    if case == "text file":
        db.write_text("not a database\n" * 20)
        return str(db), f"--distperf-history: sqlite:///{db}: file is not a database"
    if case == "directory":
        db.mkdir()
        return str(db), f"--distperf-history: {db} is a folder; give a file path"
    record_session(str(db), load())
    if case == "truncated":
        db.write_bytes(db.read_bytes()[:db.stat().st_size // 3])
        return str(db), f"--distperf-history: sqlite:///{db}: database disk image is malformed"
    assert case == "newer version"
    with HistoryStore(str(db)) as store, store.engine.begin() as conn:
        conn.execute(schema.format_version.update().values(format_version=schema.HISTORY.version + 1))
    return str(db), (f"--distperf-history: sqlite:///{db}: history database format version "
                     f"{schema.HISTORY.version + 1} is newer than the version {schema.HISTORY.version}")


BAD_TARGETS = ["text file", "truncated", "newer version", "directory"]


@pytest.mark.parametrize("case", BAD_TARGETS)
def test_check_target_refuses_what_the_session_could_not_append_to_and_changes_nothing(tmp_path, case):
    from pytest_distperf.store.history import check_target

    path, expected = _bad_sqlite_target(tmp_path, case)
    before = sorted(os.listdir(tmp_path)), (open(path, "rb").read() if os.path.isfile(path) else None)
    with pytest.raises(HistoryError) as e:
        check_target(path)
    assert str(e.value).startswith(expected)
    assert (sorted(os.listdir(tmp_path)), open(path, "rb").read() if os.path.isfile(path) else None) == before


def test_check_target_creates_nothing_upgrades_nothing_and_passes_a_usable_database(tmp_path, monkeypatch):
    from pytest_distperf.store.history import check_target

    missing = tmp_path / "new" / "deeper" / "hist.db"
    assert check_target(str(missing)) == f"sqlite:///{missing}"
    assert not (tmp_path / "new").exists()  # created at the end, by the session that records
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")  # SQLite's empty database: the tables are made at the end
    check_target(str(empty))
    assert empty.read_bytes() == b""
    db = tmp_path / "hist.db"
    record_session(str(db), load())
    monkeypatch.setattr(schema.HISTORY, "version", 2)  # an older database is fine, and is upgraded at the end only
    monkeypatch.setattr(schema.HISTORY, "updates", {2: lambda conn: pytest.fail("upgraded by the check")})
    check_target(str(db))
    assert _format_rows(f"sqlite:///{db}") == [1]


def test_check_target_on_a_server_connects_and_refuses_a_newer_database(postgres_url):
    from pytest_distperf.store.history import check_target

    assert check_target(postgres_url).startswith("postgresql+psycopg://")
    with HistoryStore(postgres_url) as store, store.engine.begin() as conn:
        conn.execute(schema.format_version.update().values(format_version=schema.HISTORY.version + 1))
    with pytest.raises(SchemaVersionError, match="^--distperf-history: postgresql.*format version 2 is newer"):
        check_target(postgres_url)


def test_check_target_on_a_closed_port_is_an_error_naming_the_option_without_the_password():
    from pytest_distperf.store.history import check_target

    with pytest.raises(HistoryUrlError, match="^--distperf-history: cannot open postgresql") as e:
        check_target("postgresql://someone:s3cret@127.0.0.1:1/nothing")
    assert "s3cret" not in str(e.value)


def _no_job_usage_error(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_early=NO_JOB)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", *args)
    out = result.stdout.str() + result.stderr.str()
    assert "a job would have started here" not in out
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out[-3000:]
    return result


@pytest.mark.parametrize("case", BAD_TARGETS)
def test_a_bad_history_database_stops_the_session_before_any_job(pytester: pytest.Pytester, case):
    """Found only at the end, after every job, it lost the session's record."""
    path, expected = _bad_sqlite_target(pytester.path, case)
    result = _no_job_usage_error(pytester, f"--distperf-history={path}")
    result.stderr.fnmatch_lines([f"*distperf: {expected}*"])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only file: the check rightly passes")
def test_a_read_only_history_database_stops_the_session_before_any_job(pytester: pytest.Pytester):
    db = pytester.path / "hist.db"
    record_session(str(db), load())
    db.chmod(0o444)
    result = _no_job_usage_error(pytester, f"--distperf-history={db}")
    result.stderr.fnmatch_lines([f"*distperf: --distperf-history: {db} exists and is not writable (mode 0444*"])


def test_a_history_server_with_nothing_listening_stops_the_session_before_any_job(pytester: pytest.Pytester):
    result = _no_job_usage_error(pytester, "--distperf-history=postgresql://u:s3cret@127.0.0.1:1/perf")
    result.stderr.fnmatch_lines(["*distperf: --distperf-history: cannot open "
                                 "postgresql+psycopg://u:***@127.0.0.1:1/perf: *"])
    assert "s3cret" not in result.stderr.str()


def test_history_command_reports_an_unwritable_output_in_one_line(tmp_path):
    db = tmp_path / "history.db"
    record_session(str(db), load())
    for flag in ("--html", "--json"):
        done = subprocess.run([sys.executable, "-m", "pytest_distperf", "history", str(db), f"{flag}=/proc/x.out"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        [line] = done.stderr.splitlines()  # one line; why /proc takes no file is store/outputs.py's to word
        assert line.startswith(f"error: {flag}: cannot write /proc/x.out: folder /proc is not writable ("), line
        assert done.stdout == ""  # checked before the history is read and printed


def test_history_command_checks_its_outputs_before_printing_anything(tmp_path, capsys):
    """A bad --html/--json fails at once, as the pytest options' do, not after the whole report is printed."""
    from pytest_distperf.__main__ import main

    db = tmp_path / "history.db"
    record_session(str(db), load())
    folder = tmp_path / "out"
    folder.mkdir()
    cases = {("--html", str(folder)): f"error: --html: {folder} is a folder; give a file path",
             ("--json", str(db)): f"error: --json: {db} is the history URL database; the report would replace every "
                                  f"session's history: give another file"}
    for (flag, path), expected in cases.items():
        assert main(["history", str(db), flag, path]) == 2
        out, err = capsys.readouterr()
        assert (out, err.splitlines()) == ("", [expected])
    assert main(["history", str(db), "--json", str(tmp_path / "t.json")]) == 0
    assert capsys.readouterr().out.endswith(f"wrote {tmp_path / 't.json'}\n")


def test_history_command_on_a_folder_says_so_as_the_pytest_option_does(tmp_path, capsys):
    from pytest_distperf.__main__ import main

    assert main(["history", str(tmp_path)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"error: history URL: {tmp_path} is a folder; give a file path"]


# -- what the command says of short series, empty filters, dirty trees and SQLite URLs ------------------------------
def _sessions(db, scales, dirty=()):
    """One session per scale (step times scaled), commit_id(i); the sessions in `dirty` ran uncommitted changes."""
    base, start = load(), _dt.datetime(2026, 11, 1, tzinfo=_dt.timezone.utc)
    for i, scale in enumerate(scales):
        doc = session_doc(base, start + _dt.timedelta(hours=i), commit_id(i), step_scale=scale)
        if i in dirty:
            doc["environment"].update(git_dirty=True, git_dirty_files=2)
        record_session(str(db), doc)


def test_a_series_too_short_for_a_change_point_says_so_not_none(tmp_path):
    """5 sessions (3, then 2 after a step): a change point needs 3 on each side, so none was looked for."""
    from pytest_distperf.store.history.trend import render_text

    db = tmp_path / "h.db"
    _sessions(db, [1.0, 1.0, 1.0, 1.5, 1.5])
    found = trends(str(db), metric="step_time", job="fsdp2", test="trains_like")
    [t] = found
    assert not t.searched and t.sessions_needed == 6 and t.change_points == ()
    text = render_text(found)
    assert ("change points: not looked for: too few sessions (5; a change point needs 3 on each side, 6 in all)"
            in text)
    assert "change points: none" not in text
    assert "1 series, 0 change point(s); 1 series too short to look for one" in text
    doc = t.to_dict()
    assert (doc["searched"], doc["sessions_needed"]) == (False, 6)
    _sessions(tmp_path / "six.db", [1.0] * 6)  # long enough: looked for, none found
    [six] = trends(str(tmp_path / "six.db"), metric="step_time", job="fsdp2", test="trains_like")
    assert six.searched and "change points: none" in render_text([six])


def test_history_command_exits_non_zero_naming_a_filter_that_matches_nothing(tmp_path, capsys):
    from pytest_distperf.__main__ import main

    db = tmp_path / "h.db"
    record_session(str(db), load())
    assert main(["history", str(db), "--test", "nosuch"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"error: no series matches --test 'nosuch' in the history {db}")
    assert main(["history", str(db), "--test", "nosuch", "--metric", "step_time"]) == 1
    assert "--test 'nosuch' and --metric 'step_time'" in capsys.readouterr().err
    assert main(["history", str(db), "--metric", "step_time"]) == 0
    empty = tmp_path / "empty.db"
    HistoryStore(str(empty)).close()  # the tables, no session
    assert main(["history", str(empty)]) == 1
    assert capsys.readouterr().err.startswith(f"error: the history {empty} holds no series")


def test_history_help_documents_the_absolute_sqlite_form():
    done = subprocess.run([sys.executable, "-m", "pytest_distperf", "history", "--help"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "sqlite:////abs/path/history.db" in text and "an absolute path has four" in text
    assert "sqlite:///tmp/x.db is tmp/x.db under the current folder" in text


def test_a_three_slash_url_to_a_missing_file_says_what_four_slashes_mean(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HistoryError) as info:
        trends("sqlite:///tmp/x.db")
    message = str(info.value)
    assert f"no history database at {tmp_path / 'tmp' / 'x.db'}" in message
    assert "sqlite:////tmp/x.db, four slashes, or the plain path /tmp/x.db" in message
    with pytest.raises(HistoryError) as info:  # four slashes: absolute, no hint
        trends(f"sqlite:///{tmp_path / 'none.db'}")
    assert "four slashes" not in str(info.value)


def test_a_dirty_session_is_named_with_its_uncommitted_changes(tmp_path):
    """A session measured on uncommitted changes is not its commit's code: every commit the trend names says so."""
    from pytest_distperf.store.history.trend import render_text

    db = tmp_path / "h.db"
    _sessions(db, [1.0] * 4 + [1.3] * 4, dirty={4})
    [t] = trends(str(db), metric="step_time", job="fsdp2", test="trains_like")
    assert [p.git_dirty for p in t.points] == [False] * 4 + [True] + [False] * 3
    [cp] = t.change_points
    assert cp.commit_range == f"{commit_id(3)[:12]}..{commit_id(4)[:12]} + uncommitted changes"
    text = render_text([t], points=True)
    assert f"and {commit_id(4)[:12]} + uncommitted changes (" in text
    assert f"{commit_id(3)[:12]}  " in text  # a clean one as it was
    assert t.to_dict()["points"][4]["git_dirty"] is True
