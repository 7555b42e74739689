"""--distperf-session-budget bounds the session (issue #41): no job, and no DeepSpeed op build, starts past the
session's deadline; a test whose first look cannot start is skipped, out of budget (fails with --distperf-strict),
and every report counts it; adaptive repeats it stops keep their last planned look; each xdist worker's reserve for
later tests counts its own share of them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pytest_distperf.decide import decision as d
from pytest_distperf.decide.stopping import Budget, Clock, until_decided
from pytest_distperf.errors import SessionBudgetSpent
from pytest_distperf.rank.results import RankResult, RunResult
from pytest_distperf.session import DistPerfSession, SessionLedger
from pytest_distperf.spec.job import JobSpec
from pytest_distperf.spec.settings import TestPlan as Plan, build_settings

INNER = ("--distperf", "-p", "no:cacheprovider", "-rsfE")

STEP = """
import torch
import torch.distributed as dist

def make_step():
    x = torch.ones(16)
    def step():
        dist.all_reduce(x)
        return x.sum()
    return step
"""


def _session(budget: float) -> DistPerfSession:
    return DistPerfSession(SimpleNamespace(), build_settings(True, {"session_budget": budget}, {}), None)


# -- the deadline: one, on the session, on the budget's clock ---------------------------------------------------
def test_no_job_starts_past_the_deadline_and_a_slot_wait_is_not_counted():
    session = _session(360)
    session.check_budget("job ddp tiny x2 cpu")  # within the budget: nothing happens
    session.deadline -= 361.0  # 361 s of the session's own time have gone
    with pytest.raises(SessionBudgetSpent, match=r"^session budget 360 s spent \(361 s run, waits for the "
                                                 r"measurement slot left out\): job ddp tiny x2 cpu not started$"):
        session.check_budget("job ddp tiny x2 cpu")
    session.ledger.slot_wait_seconds += 5.0  # 5 s of them waiting for another session's job to free the slot
    session.check_budget("job ddp tiny x2 cpu")  # 356 s of its own: the job may start
    assert _session(360).deadline is not None and DistPerfSession(
        SimpleNamespace(), build_settings(True, {}, {}), None).deadline is None  # no budget, no deadline
    DistPerfSession(SimpleNamespace(), build_settings(True, {}, {}), None).check_budget("anything")


def test_no_deepspeed_op_build_starts_past_the_deadline(tmp_path, monkeypatch):
    from pytest_distperf.strategies import ds_ops

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # nothing built there
    built = []

    def spent(what: str) -> None:
        raise SessionBudgetSpent(f"session budget 1 s spent: {what} not started")

    with pytest.raises(SessionBudgetSpent, match="the build of DeepSpeed's op.s. cpu_adam not started"):
        ds_ops.ensure(["CPUAdamBuilder"], "cpu", run=lambda *a, **k: built.append(a), may_start=spent)
    assert not built


# -- adaptive repeats: the deadline's hard stop leaves the last planned look ------------------------------------
def test_adaptive_pairs_stop_where_a_job_could_not_start():
    a, b = [1.0, 1.3, 1.1], [1.0, 1.0, 1.0]
    added = []

    def add_pair():
        if len(added) == 1:  # the second pair of the step to the look at 6: the deadline has passed
            raise SessionBudgetSpent("session budget 10 s spent: job x not started")
        added.append(1)
        a.append(1.05)
        b.append(1.0)

    v = until_decided(lambda: d.decide(d.paired(a, b), 1.08), add_pair,
                      Budget(max_pairs=12, deadline_text="session budget 10 s"), Clock())
    assert v.outcome == d.INCONCLUSIVE and v.stopped == "session budget 10 s" and len(added) == 1


def _result(step: float) -> RunResult:
    spec = JobSpec(world_size=2, device="cpu", strategy="ddp")
    ranks = [RankResult(rank=r, step_times=[step] * 3, losses=[1.0, 0.9], cuda_peak_allocated=None,
                        cuda_peak_reserved=None, host_peak_rss=200, host_rss_before_build=100,
                        optimizer_state_bytes=1200, num_params=100, tokens_per_step=512, build_seconds=0.0,
                        warmup_seconds=0.0) for r in range(2)]
    return RunResult(spec=spec, ranks=ranks, wall_seconds=1.0)


@pytest.mark.parametrize("strict", [False, True])
def test_a_first_look_the_budget_cuts_skips_the_test_and_leaves_whole_pairs(strict):
    from _pytest.outcomes import Failed, Skipped

    from pytest_distperf.fixture import DistPerf

    settings = build_settings(True, {"strict": strict, "session_budget": 60}, {})
    ledger = SessionLedger()
    launches = []

    def check(what: str) -> None:
        if len(launches) == 3:  # pair 2 (B then A): its second job, A's, finds the deadline passed
            raise SessionBudgetSpent(f"session budget 60 s spent: {what} not started")

    dp = DistPerf(settings, Plan(device="cpu", world_size=2, timeout=60.0, repeats=3), ledger, "t.py::test_x",
                  "/tmp", check_budget=check)

    def run_once(job: JobSpec, remember_failure: bool = True) -> RunResult:
        dp._check_budget(f"job {job.describe()}")  # as _launch does, before the job's slot
        launches.append(job.strategy)
        return _result(0.1)

    dp._run_once = run_once
    a, b = JobSpec(world_size=2, device="cpu", strategy="ddp"), JobSpec(world_size=2, device="cpu", strategy="fsdp")
    with pytest.raises(Failed if strict else Skipped, match="session budget 60 s spent: job ddp .* not started"):
        dp.compare(a, b, shared=True)
    assert dp.out_of_budget.startswith("session budget 60 s spent")
    runs_a, runs_b, _ = ledger.comparisons[(a.config_hash(), b.config_hash())]
    assert len(runs_a) == len(runs_b) == 1  # pair 2's B run was dropped: a later test sharing them stays paired


def test_a_first_look_that_would_end_past_the_deadline_is_not_started():
    # as a later look is not (stopping.stop_reason): the look's runs at what this session's runs of the same jobs
    # took; a job not run yet counts nothing, and a look that fits starts
    from _pytest.outcomes import Skipped

    from pytest_distperf.fixture import DistPerf

    settings = build_settings(True, {"session_budget": 100}, {})
    ledger, now = SessionLedger(), [0.0]
    ledger.budget_now = lambda: now[0]  # type: ignore[method-assign]
    a, b = JobSpec(world_size=2, device="cpu", strategy="ddp"), JobSpec(world_size=2, device="cpu", strategy="fsdp")
    launches = []

    def fixture() -> DistPerf:
        dp = DistPerf(settings, Plan(device="cpu", world_size=2, timeout=60.0, repeats=3), ledger, "t.py::test_x",
                      "/tmp", deadline=100.0)

        def run_once(job: JobSpec, side: str = "head") -> RunResult:
            launches.append(job.strategy)
            now[0] += 10.0  # every run takes 10 s
            return _result(0.1)

        dp._run_once = run_once  # type: ignore[method-assign]
        return dp

    fixture().run(a)  # a's first run: 10 s, at 10 s
    assert ledger.run_seconds == {a.describe(): 10.0}
    now[0] = 75.0  # 25 s left: three runs of a would take 30
    with pytest.raises(Skipped, match=r"session budget 100 s: 25 s left, and the first look \(3 runs of ddp .*\) "
                                      r"would take about 30 s at this session's runs of the same jobs: not started"):
        fixture().measure(a)
    with pytest.raises(Skipped, match=r"first look \(3 runs of ddp .* and fsdp .*\) would take about 30 s"):
        fixture().compare(a, b)  # b not run yet: it counts nothing
    assert launches == ["ddp"]  # no job of either look started
    now[0] = 65.0  # 35 s left: the look fits
    fixture().measure(a)
    assert launches == ["ddp"] * 4


# -- xdist: each worker reserves for its own share of the later tests --------------------------------------------
def test_the_reserve_counts_a_workers_share_of_the_later_tests():
    from pytest_distperf.plugin import _tests_left, plan_key

    class Item:
        def __init__(self):
            self.stash = {plan_key: SimpleNamespace(device="cpu")}

        def get_closest_marker(self, name):
            return object()

    items = [Item() for _ in range(9)]

    def left(index: int, **config) -> int:
        return _tests_left(SimpleNamespace(session=SimpleNamespace(items=items), node=items[index],
                                           config=SimpleNamespace(**config)))

    assert left(0) == 9 and left(8) == 1  # one process: this test and every later one
    assert left(0, workerinput={"workercount": 4}) == 1 + 2  # 8 later tests, 4 workers: 2 each (rounded up)
    assert left(6, workerinput={"workercount": 4}) == 1 + 1
    assert left(8, workerinput={"workercount": 4}) == 1


# -- a session, every report -------------------------------------------------------------------------------------
SESSION = """
import time

import pytest


@pytest.mark.distperf(world_size=2)
def test_first(distperf):
    distperf.run(distperf.step_job("steps:make_step", steps=2, warmup=1))


def test_spends_the_budget():
    time.sleep({budget} + 0.5)


@pytest.mark.distperf(world_size=2)
def test_late(distperf):
    distperf.run(distperf.step_job("steps:make_step", steps=2, warmup=1))


@pytest.mark.distperf(world_size=2)
def test_late_measure(distperf):
    distperf.measure(distperf.step_job("steps:make_step", steps=2, warmup=1))


@pytest.fixture
def measured(distperf):
    return distperf.run(distperf.step_job("steps:make_step", steps=2, warmup=1))


@pytest.mark.distperf(world_size=2)
def test_late_fixture(distperf, measured):  # its job is in its setup (as perf_tests/test_offload.py's shared probe)
    pass
"""


@pytest.mark.slow
def test_a_session_ends_at_its_budget_and_every_report_names_the_tests_left_out(pytester: pytest.Pytester,
                                                                                  monkeypatch):
    budget = 6
    pytester.makepyfile(steps=STEP)
    pytester.makepyfile(test_mine=SESSION.replace("{budget}", str(budget)))
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    report, comment = pytester.path / "report.json", pytester.path / "comment.md"
    result = pytester.runpytest(*INNER, f"--distperf-session-budget={budget}", f"--distperf-json={report}",
                                f"--distperf-pr-comment={comment}")
    result.assert_outcomes(passed=2, skipped=3)
    not_started = (f"session budget {budget} s spent (* s run, waits for the measurement slot left out): job "
                   f"step:steps:make_step x2 cpu not started")
    result.stdout.fnmatch_lines([
        f"*no job starts past it (waits for the measurement slot not counted, each xdist worker its own), nor a "
        f"first look that would end past it at this session's runs of the same jobs: a test whose first look "
        f"cannot start is skipped, out of budget",  # the header
        "distperf: 3 out of budget: not decided: the session budget ran out before their first look was done "
        "(--distperf-session-budget); skipped, no verdict",
        f"  test_late: {not_started}",
        f"  test_late_measure: {not_started}",
        f"  test_late_fixture: {not_started}",
        f"SKIPPED [[]1[]] test_mine.py:*: {not_started}",  # at the test, not in the plugin
        "*= 2 passed, 3 skipped, *3 out of budget in *",
    ])
    doc = json.loads(report.read_text())
    assert doc["format_version"] == 1 and doc["summary"]["out_of_budget"] == 3
    tests = {t["nodeid"].split("::")[1]: t for t in doc["tests"]}
    assert tests["test_first"]["out_of_budget"] is None and len(tests["test_first"]["jobs"]) == 1
    for name in ("test_late", "test_late_measure", "test_late_fixture"):
        assert tests[name]["outcome"] == "skipped" and not tests[name]["jobs"]  # no job started past the deadline
        assert tests[name]["out_of_budget"].startswith(f"session budget {budget} s spent")
    markdown = summary.read_text()
    assert "**4 test(s)**: 1 passed, 0 failed, 3 out of budget" in markdown  # the distperf tests
    assert "**⏱ 3 out of budget**" in markdown and "- `test_late`: session budget" in markdown
    text = comment.read_text()
    assert "### distperf: ⏱ not all measured" in text and "3 out of budget)" in text
    assert "- `test_late_measure`: session budget" in text


def test_strict_fails_a_test_the_budget_left_unstarted(pytester: pytest.Pytester):
    pytester.makepyfile(steps=STEP)
    pytester.makepyfile(test_mine=SESSION.replace("{budget}", "1"))
    result = pytester.runpytest(*INNER, "--distperf-session-budget=1", "--distperf-strict", "-k",
                                "spends or late")
    result.assert_outcomes(passed=1, failed=2, errors=1)  # test_late_fixture's setup fails: pytest's error
    result.stdout.fnmatch_lines([
        "*session budget 1 s spent (* s run, waits for the measurement slot left out): job step:steps:make_step x2 "
        "cpu not started",
        "*(--distperf-strict: a test the session budget left unstarted fails)",
        "distperf: 3 out of budget: *; they fail (--distperf-strict)",
        "FAILED test_mine.py::test_late - *session budget 1 s spent*",
        "*= 2 failed, 1 passed, *1 error, 3 out of budget in *",
    ])


def test_the_json_report_reads_back_out_of_budget():
    from pytest_distperf.report.document import SessionDocument, TestDocument
    from pytest_distperf.report.files import json_report, markdown_summary
    from pytest_distperf.report.pr_comment import render_pr_comment

    late = TestDocument("t.py::test_late", "skipped", 0.0, out_of_budget="session budget 9 s spent (9 s run, waits "
                                                                           "for the measurement slot left out): job "
                                                                           "ddp tiny x2 cpu not started")
    doc = json_report([TestDocument("t.py::test_first", "passed", 1.0), late], {}, {})
    assert doc["summary"]["out_of_budget"] == 1 and doc["tests"][0]["out_of_budget"] is None
    again = SessionDocument.from_json(json.loads(json.dumps(doc)))
    assert [t.out_of_budget for t in again.tests] == [None, late.out_of_budget]
    assert "**2 test(s)**: 1 passed, 0 failed, 1 out of budget" in markdown_summary(again.tests)
    assert "(2 tests: 1 pass, 1 skipped, 1 out of budget)" in render_pr_comment(doc)
