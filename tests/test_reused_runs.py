"""A job that several tests of a session run: each test's figures come from its own runs, whatever ran before it
(what one run of a job suffices for, JobSpec.measure_once, is measured in every test's view of the job); and a
first look the session budget cuts short keeps the runs that ran and says so ("cut short", not "not started")."""

from __future__ import annotations

import json

import pytest

from pytest_distperf.errors import SessionBudgetSpent
from pytest_distperf.rank.results import RankResult, RunResult
from pytest_distperf.session import SessionLedger
from pytest_distperf.spec.job import JobSpec
from pytest_distperf.spec.settings import TestPlan as Plan, build_settings

INNER = ("--distperf", "-p", "no:cacheprovider", "-rsfE")
COUNTS = {"aten_ops_per_step", "flops_per_step"}  # measured once per test's view of a job (the counting pass)


# -- which runs measure once: the rule, on launches that only record what they were asked -------------------------
def _fixture(ledger: SessionLedger, nodeid: str, asked: list[tuple[str, bool]], launches: int | None = None,
             **settings):
    """A test's fixture whose launches record (strategy, measure_once); with `launches`, the session budget is
    spent once that many jobs have started (a job's check_budget says so, as session.check_budget does)."""
    from pytest_distperf.fixture import DistPerf

    def check(what: str) -> None:
        if launches is not None and len(asked) >= launches:
            raise SessionBudgetSpent(f"session budget 8 s spent: {what} not started")

    dp = DistPerf(build_settings(True, settings, {}), Plan(device="cpu", world_size=1, timeout=60.0, repeats=2),
                  ledger, nodeid, "/tmp", check_budget=check)

    def launch(job: JobSpec, remember_failure: bool = True) -> dict[int, RankResult]:
        dp._check_budget(f"job {job.describe()}")
        asked.append((job.strategy or "", job.measure_once))
        return {0: RankResult(rank=0, step_times=[0.01] * 3, losses=[], cuda_peak_allocated=None,
                              cuda_peak_reserved=None, host_peak_rss=200, host_rss_before_build=100,
                              optimizer_state_bytes=1200, num_params=100, tokens_per_step=512, build_seconds=0.0,
                              warmup_seconds=0.0)}

    dp._launch = launch  # type: ignore[method-assign]
    return dp


def test_every_test_measures_once_in_its_own_runs_of_a_job():
    ledger, asked = SessionLedger(), []
    a, b = JobSpec(world_size=1, device="cpu", strategy="ddp"), JobSpec(world_size=1, device="cpu", strategy="fsdp2")
    first = _fixture(ledger, "t.py::test_first", asked)
    first.compare(a, b)  # 2 pairs: each job's first run measures once
    assert asked == [("ddp", True), ("fsdp2", True), ("fsdp2", False), ("ddp", False)]
    asked.clear()
    later = _fixture(ledger, "t.py::test_later", asked)
    later.measure(a)  # the same job in a later test: its first run measures once again (its figures read its runs)
    assert asked == [("ddp", True), ("ddp", False)]
    asked.clear()
    later.run(a)  # a second run list of the job in one test (its own record): it gets one run that measured once
    later.run(a)  # ... and the same for the next
    assert asked == [("ddp", True), ("ddp", True)]
    asked.clear()
    shared = _fixture(ledger, "t.py::test_shared", asked)
    shared.compare(a, b, shared=True)
    _fixture(ledger, "t.py::test_shares", asked).compare(a, b, shared=True, repeats=3)  # extends the shared pairs
    assert asked == [("ddp", True), ("fsdp2", True), ("fsdp2", False), ("ddp", False), ("ddp", False),
                     ("fsdp2", False)]  # the later test's view is the shared runs, which measured once
    runs_a, runs_b, _ = ledger.comparisons[(a.config_hash(), b.config_hash())]
    assert [r.spec.measure_once for r in runs_a] == [True, False, False]


def test_a_first_look_the_budget_cuts_short_keeps_its_runs_and_says_so():
    from _pytest.outcomes import Failed, Skipped

    ledger, asked = SessionLedger(), []
    a, b = JobSpec(world_size=1, device="cpu", strategy="ddp"), JobSpec(world_size=1, device="cpu", strategy="fsdp2")
    dp = _fixture(ledger, "t.py::test_x", asked, launches=1, session_budget=8)  # the deadline passes in the first
    with pytest.raises(Skipped, match=r"^session budget 8 s spent: job ddp tiny x1 cpu not started; the first look "
                                      r"was cut short after 1 of its 2 runs: what ran is in the report, with no "
                                      r"verdict$"):
        dp.measure(a)
    assert dp.out_of_budget and "cut short after 1 of its 2 runs" in dp.out_of_budget
    [job] = dp.test_records()
    assert job.figures.runs == 1 and job.figures.label == a.describe()  # the run that ran is in the report

    asked.clear()
    dp = _fixture(ledger, "t.py::test_pair", asked, launches=1, session_budget=8)
    with pytest.raises(Skipped, match=r"job fsdp2 tiny x1 cpu not started$"):  # in its first pair: nothing kept
        dp.compare(a, b, shared=True)
    assert dp.test_records() == []
    runs_a, runs_b, _ = ledger.comparisons[(a.config_hash(), b.config_hash())]
    assert runs_a == runs_b == []  # the shared lists stay whole pairs

    asked.clear()  # past the deadline before the first job: not started, nothing to keep
    strict = _fixture(ledger, "t.py::test_late", asked, launches=0, session_budget=8, strict=True)
    with pytest.raises(Failed, match=r"job ddp tiny x1 cpu not started\n.*left unstarted fails\)$"):
        strict.measure(a)
    assert asked == [] and strict.test_records() == []

    strict = _fixture(ledger, "t.py::test_cut", asked, launches=1, session_budget=8, strict=True)
    with pytest.raises(Failed, match=r"cut short after 1 of its 2 runs.*\n.*session budget cut short in its first "
                                     r"look fails\)$"):
        strict.measure(a)


# -- end to end: the reported defects, on real 2-rank jobs ----------------------------------------------------------
BENCH = """
import torch
import torch.nn as nn
import torch.nn.functional as F
from pytest_distperf import Workload


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return torch.relu(self.lin(x))


def _batch(step, rank):
    g = torch.Generator().manual_seed(step * 100 + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)


def make_workload():
    return Workload(model=lambda: nn.Sequential(Block(), Block()), batch=_batch,
                    loss=lambda m, b: F.mse_loss(m(b[0]), b[1]), wrap_units=(Block,))
"""

TESTS = """
import pytest

W = dict(workload="bench:make_workload", warmup=1)


@pytest.mark.distperf(world_size=2)
def test_ddp_vs_fsdp2(distperf):
    distperf.compare(distperf.job("ddp", steps=3, **W), distperf.job("fsdp2", steps=3, **W), repeats=1)


@pytest.mark.distperf(world_size=2)
def test_bad_limit(distperf):
    distperf.compare(distperf.job("ddp", steps=3, **W), distperf.job("ddp", steps=5, **W), repeats=1)
"""


def _jobs(report) -> dict[str, list[dict]]:
    return {t["nodeid"].split("::")[1]: t["jobs"] for t in json.loads(report.read_text())["tests"]}


def test_a_job_an_earlier_test_ran_keeps_its_counts_and_their_gate(pytester: pytest.Pytester):
    pytester.makepyfile(bench=BENCH, test_mine=TESTS)
    pytester.makeconftest("")
    report = pytester.path / "report.json"
    small = ("--distperf-max-repeats", "2")
    pytester.runpytest(*INNER, *small, "--distperf-save", "test_mine.py::test_bad_limit").assert_outcomes(passed=1)
    result = pytester.runpytest(*INNER, *small, "--distperf-require-baseline", f"--distperf-json={report}")
    result.assert_outcomes(passed=1, failed=1)  # test_ddp_vs_fsdp2 has no baseline
    result.stdout.fnmatch_lines(["*ddp bench:make_workload x2 cpu (5 metrics) in test_ddp_vs_fsdp2*"])
    jobs = _jobs(report)
    for test in ("test_ddp_vs_fsdp2", "test_bad_limit"):
        for job in jobs[test]:  # ddp's first run was test_ddp_vs_fsdp2's: test_bad_limit counts in its own
            assert COUNTS <= set(job["figures"]["work"]), (test, job["figures"]["label"], job["figures"]["work"])
    verdicts = json.loads(report.read_text())["tests"][1]["verdicts"]
    gated = {(v["job"], v["metric"]): v["status"] for v in verdicts}
    labels = [job["figures"]["label"] for job in jobs["test_bad_limit"]]
    assert len(labels) == 2 and labels[0] == "ddp bench:make_workload x2 cpu"
    for label in labels:  # the stored counts of both jobs are decided, none left out
        assert gated[(label, "aten_ops_per_step")] == gated[(label, "flops_per_step")] == "pass", gated


SLOW_STEP = """
import time

import torch
import torch.distributed as dist


def make_step(pause=0.0):
    time.sleep(pause)  # the build, before any timed step: the first run outlasts the session budget
    x = torch.ones(16)

    def step():
        dist.all_reduce(x)
        return x.sum()
    return step
"""

BUDGETED = """
import pytest


@pytest.mark.distperf(world_size=1)
def test_first(distperf):
    distperf.measure(distperf.step_job("steps:make_step", kwargs={"pause": 3.0}, steps=2, warmup=1))


@pytest.mark.distperf(world_size=1)
def test_second(distperf):
    distperf.measure(distperf.step_job("steps:make_step", steps=2, warmup=1))
"""


def test_a_run_the_budget_cut_short_is_kept_and_named_so(pytester: pytest.Pytester):
    pytester.makepyfile(steps=SLOW_STEP, test_mine=BUDGETED)
    pytester.makeconftest("")
    report = pytester.path / "report.json"
    result = pytester.runpytest(*INNER, "--distperf-session-budget=1", f"--distperf-json={report}")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines([
        "SKIPPED [[]1[]] test_mine.py:*: session budget 1 s spent (* s run, waits for the measurement slot left "
        "out): job step:steps:make_step(pause=3.0) x1 cpu not started; the first look was cut short after 1 of its "
        "3 runs: what ran is in the report, with no verdict",
        "SKIPPED [[]1[]] test_mine.py:*: session budget 1 s spent (*): job step:steps:make_step x1 cpu not started",
    ])
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads(report.read_text())["tests"]}
    assert "cut short" in tests["test_first"]["out_of_budget"] and not tests["test_first"]["verdicts"]
    [job] = tests["test_first"]["jobs"]
    assert job["figures"]["label"] == "step:steps:make_step(pause=3.0) x1 cpu" and job["figures"]["runs"] == 1
    assert tests["test_second"]["jobs"] == [] and "not started" in tests["test_second"]["out_of_budget"]
