"""Head against base (--distperf-against=REF, decide/against.py): a real git repository, a real worktree of the
base commit and real CPU jobs whose ranks import the project from each side.

The project's step sleeps a module constant; the head commit doubles it. Interleaved head/base pairs decide
step time FAIL on the pairs, with both commits named; a test file the head adds reads "new"; a REF that does
not exist is a usage error naming it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pytest_distperf.errors import SettingsError
from pytest_distperf.decide import against
from pytest_distperf.spec.job import FunctionRef, JobSpec

STEPS = """
import time

DELAY = {delay}


def sleeper():
    def step():
        time.sleep(DELAY)
    return step
"""

TEST = """
import pytest


@pytest.mark.distperf(world_size=1, max_repeats=3)
def test_{name}(distperf):
    distperf.measure(distperf.step_job("steps:sleeper", steps=5, warmup=1))
"""


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(pytester: pytest.Pytester) -> Path:
    root = pytester.path
    git(root, "init", "-q", "-b", "main")
    (root / "steps.py").write_text(STEPS.format(delay=0.02))
    (root / "test_perf.py").write_text(TEST.format(name="sleeper"))
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "base")
    return root


@pytest.mark.slow
def test_a_slower_head_fails_on_the_pairs_and_a_new_test_reads_new(pytester: pytest.Pytester, repo: Path):
    git(repo, "switch", "-q", "-c", "change")
    (repo / "steps.py").write_text(STEPS.format(delay=0.04))  # the change under test: twice the step's work
    (repo / "test_added.py").write_text(TEST.format(name="added"))
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "slower")
    base, head = git(repo, "rev-parse", "main"), git(repo, "rev-parse", "HEAD")

    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "-rA", "--distperf-against=main",
                                "--distperf-json=r.json")
    out = result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    assert f"head {head[:12]} vs base {base[:12]} (merge base of main and HEAD)" in out
    assert "distperf head vs base failed for test_perf.py::test_sleeper" in out
    doc = json.loads((repo / "r.json").read_text())
    assert doc["invocation"]["against"]["base_commit"] == base
    tests = {t["nodeid"]: t for t in doc["tests"]}
    step = next(v for v in tests["test_perf.py::test_sleeper"]["verdicts"] if v["metric"] == "step_time")
    assert step["status"] == "fail" and step["base_commit"] == base and step["head_commit"] == head
    assert 0.6 < step["delta"] < 1.4, step  # twice the sleep: +100 %, measured on the pairs
    assert step["baseline_runs"] == step["current_runs"] == 3
    added = tests["test_added.py::test_added"]["verdicts"]
    assert [v["status"] for v in added] == ["new"] and "does not exist at base" in added[0]["note"]
    assert git(repo, "worktree", "list").count("\n") == 0  # the base worktree is gone with the session


def test_a_ref_that_does_not_exist_is_a_usage_error(pytester: pytest.Pytester, repo: Path):
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "--distperf-against=nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--distperf-against=nope: no commit 'nope' in*"])


def test_outside_a_repository_and_with_save(tmp_path: Path, pytester: pytest.Pytester, repo: Path):
    with pytest.raises(SettingsError, match="is not inside a git repository"):
        against.prepare(str(tmp_path), "main")
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "--distperf-against=main",
                                "--distperf-save")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--distperf-against*--distperf-save*give one of them*"])


def test_the_base_side_imports_the_project_from_the_worktree_and_the_harness_from_head(repo: Path):
    checkout = against.prepare(str(repo), "main", exact=True)
    try:
        job = JobSpec(world_size=1, device="cpu", step=FunctionRef("steps", "sleeper", str(repo / "steps.py")),
                      sys_path=[str(repo), "/usr/lib/python3/dist-packages"])
        base = checkout.base_job(job)
        assert base.sys_path[:2] == [checkout.harness_dir, checkout.worktree]
        assert "/usr/lib/python3/dist-packages" in base.sys_path and str(repo) not in base.sys_path
        assert base.step.file == str(Path(checkout.worktree) / "steps.py")
        assert base.config_hash() == job.config_hash()  # the same job: only where its code comes from differs
        assert (Path(checkout.harness_dir) / "pytest_distperf" / "__init__.py").exists()
        assert checkout.dirty == "" and checkout.problem == ""
    finally:
        checkout.remove()
    assert not Path(checkout.worktree).exists()


def test_the_progress_line_says_head_vs_base_and_pairs():
    from pytest_distperf.decide.regression import until_job_decided
    from pytest_distperf.decide.stopping import Budget, Clock
    from pytest_distperf.decide.verdicts import MetricVerdict

    pairs, lines = [3], []
    undecided = MetricVerdict(test="t", job="j", metric="step_time", metric_kind="time", unit="s", direction="lower",
                              status="inconclusive", delta=0.02, low=-0.1, high=0.15, threshold=0.05)

    def extend() -> None:
        pairs[0] += 1

    until_job_decided(lambda: [undecided], lambda: pairs[0], extend, Budget(max_pairs=6), Clock(), False,
                      lines.append, "ddp x1 cpu", against="head vs base", unit="pairs")
    assert lines and lines[0].startswith("head vs base step_time of ddp x1 cpu inconclusive after 3 pairs ("), lines
    assert "running pairs 4-6 for the look at 6" in lines[0] and "baseline" not in lines[0]


def test_each_run_pairs_with_its_base_twin_in_turn_and_a_failing_base_is_recorded_not_raised():
    from pytest_distperf.decide.policy import Policy
    from pytest_distperf.errors import SessionBudgetSpent

    checkout = against.BaseCheckout(ref="main", exact=True, head_commit="1" * 40, base_commit="2" * 40,
                                    repo_root="/repo", worktree="/base", harness_dir="/harness")
    gate = against.AgainstGate(checkout, "t.py::test_x", Policy(), machine=None, environment={})
    job = JobSpec(world_size=1, device="cpu", strategy="ddp", sys_path=["/repo"])
    sides, fail = [], []

    def run_once(spec: JobSpec, side: str) -> object:
        sides.append(side)
        if side == "base" and fail:
            raise fail[0]
        assert (side == "base") == (spec.sys_path[:2] == ["/harness", "/base"])  # the base side runs REF's code
        return object()

    heads = [gate.run(job, run_once) for _ in range(2)]
    assert sides == ["head", "base", "base", "head"]  # head first, then base first: drift hits both orders
    [paired] = gate.jobs.values()
    assert paired.runs == heads and len(paired.base_runs) == 2
    fail.append(SessionBudgetSpent("session budget spent"))
    with pytest.raises(SessionBudgetSpent):  # not the base side's failure: no pair
        gate.run(job, run_once)
    fail[0] = RuntimeError("boom\n\nsecond line\nthird\nfourth")
    sides.clear()
    head = gate.run(job, run_once)
    assert sides == ["head", "base"] and paired.base_error == "boom\nsecond line\nthird"
    assert head not in paired.runs and len(paired.base_runs) == 2  # a failed pair is not kept
    sides.clear()
    gate.run(job, run_once)
    assert sides == ["head"]  # the base side failed: later runs are head's alone


def test_the_session_chooses_each_tests_gate_in_one_place(tmp_path: Path):
    from types import SimpleNamespace

    from pytest_distperf.decide.policy import GateSettings, Policy
    from pytest_distperf.decide.regression import BaselineGate, GateSession
    from pytest_distperf.session import DistPerfSession
    from pytest_distperf.spec.settings import TestPlan, build_settings

    gates = GateSession(GateSettings(str(tmp_path / "baselines"), False, Policy()), str(tmp_path))
    session = DistPerfSession(SimpleNamespace(), build_settings(True, {}, {}), gates)
    plan = TestPlan(device="cpu", world_size=2, timeout=60.0, repeats=3)
    assert type(session.gate_for("t.py::test_x", str(tmp_path / "t.py"), plan, Policy())) is BaselineGate
    session.against = against.BaseCheckout(ref="main", exact=True, head_commit="1" * 40, base_commit="2" * 40,
                                           repo_root=str(tmp_path), worktree="/base", harness_dir="/harness")
    gate = session.gate_for("t.py::test_x", str(tmp_path / "t.py"), plan, Policy())
    assert type(gate) is against.AgainstGate and "does not exist at base 222222222222" in gate.new_reason


SCRIPT = """
import time

import torch

model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(40):
    model(torch.randn(4, 8)).sum().backward()
    time.sleep({delay})
    opt.step()
"""


@pytest.mark.slow
def test_a_script_job_runs_the_base_s_script_on_the_base_side(pytester: pytest.Pytester, repo: Path):
    (repo / "train.py").write_text(SCRIPT.format(delay=0.02))
    (repo / "test_perf.py").write_text("""
import pytest


@pytest.mark.distperf(world_size=1, max_repeats=3)
def test_script(distperf):
    distperf.measure(distperf.script_job("train.py", steps=5, warmup=1))
""")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "a script")
    git(repo, "switch", "-q", "-c", "change")
    (repo / "train.py").write_text(SCRIPT.format(delay=0.04))  # the change under test: the script's step slower
    git(repo, "commit", "-q", "-am", "slower script")

    checkout = against.prepare(str(repo), "main")
    try:
        from pytest_distperf.spec.userjobs import script_ref

        job = JobSpec(world_size=1, device="cpu", script=script_ref(repo / "train.py", (), "torchrun", None, None,
                                                                    "cpu"))
        base = checkout.base_job(job)
        assert base.script.path == str(Path(checkout.worktree) / "train.py")
        assert base.script.sha256 != job.script.sha256 and base.config_hash() == job.config_hash()
    finally:
        checkout.remove()

    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "-rA", "--distperf-against=main",
                                "--distperf-json=r.json")
    result.assert_outcomes(failed=1)
    doc = json.loads((repo / "r.json").read_text())
    step = next(v for v in doc["tests"][0]["verdicts"] if v["metric"] == "step_time")
    assert step["status"] == "fail" and 0.5 < step["delta"] < 1.5, step  # twice the sleep, on the pairs
