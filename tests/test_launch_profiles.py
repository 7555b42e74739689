"""Launch as the user launches: `launch="controlled" | "as_user"` per job, recorded in its configuration.

Real 2-rank CPU jobs: each rank reports how it was started (the launcher, OMP_NUM_THREADS, its
intra-op threads, its cores) in RankResult.extra["launch"]; Lightning's front-ends launched as their
users launch them (`python script.py`, Lightning's own launcher starting rank 1 and the process group)
train like under the harness's controlled launch; a failing rank of such a job is named with its
traceback. The thread rules of each profile are checked on plain values.
"""

from __future__ import annotations

import json

import pytest

from pytest_distperf.errors import UsageError
from pytest_distperf.spec.profiles import PROFILES, check_choice, resolve, thread_environment

INNER = ("--distperf", "-p", "no:cacheprovider", "-rsfE")

HELPERS = """
import time

import torch
import torch.nn as nn

from pytest_distperf.spec.workloads import Workload


def sleeper():
    return lambda: time.sleep(0.001)


def fails_on_rank_one():
    def batch(step, rank):
        if rank == 1:
            raise RuntimeError("no data for rank one")
        return (torch.ones(2, 4),)
    return Workload(model=lambda: nn.Linear(4, 1), batch=batch, loss=lambda m, b: m(b[0]).sum())
"""


ELASTIC_TESTS = """
import os
import pytest
from launchhelpers import sleeper

pytestmark = pytest.mark.distperf(world_size=2)

def launch_of(distperf, **kw):
    run = distperf.run(distperf.step_job(sleeper, steps=2, warmup=1, **kw))
    return [r.extra["launch"] for r in run.ranks], run

def test_controlled_and_as_user(distperf, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cores = len(os.sched_getaffinity(0))
    controlled, run = launch_of(distperf)
    assert run.spec.launch == "controlled" and "as_user" not in run.spec.describe()
    for info in controlled:
        assert info["profile"] == "controlled" and info["started_by"] == "torch elastic"
        assert info["omp_num_threads"] == str(max(1, cores // 2)) and info["cpus"] == max(1, cores // 2)
    as_user, run = launch_of(distperf, launch="as_user")
    assert run.spec.launch == "as_user" and run.spec.launch_profile == "torchrun"
    assert run.spec.describe().endswith(" as_user:torchrun")
    assert run.spec.config_hash() != distperf.step_job(sleeper, steps=2, warmup=1).config_hash()
    for info in as_user:
        assert info["profile"] == "torchrun" and info["omp_num_threads"] == "1" and info["cpus"] == cores

def test_bad_launch(distperf):
    distperf.step_job(sleeper, launch="torchrun")
"""

LIGHTNING_TESTS = """
import pytest

pytestmark = pytest.mark.distperf(world_size=2, repeats=1)

@pytest.mark.parametrize("front_end", ["lightning_trainer", "lightning_fabric"])
def test_trains_like_the_controlled_launch(distperf, front_end):
    user = distperf.job(front_end, launch="as_user", steps=3, warmup=1)
    assert user.launch_profile == "lightning" and user.describe().endswith(" as_user:lightning")
    cmp = distperf.compare(user, distperf.job(front_end, steps=3, warmup=1))
    cmp.assert_losses_match(1e-4)
    for r in cmp.a.runs[0].ranks:
        info = r.extra["launch"]
        assert info["started_by"] == "lightning" and info["profile"] == "lightning"
        assert info["cluster_environment"] == "LightningEnvironment"
    assert [r.extra["launch"]["started_by"] for r in cmp.b.runs[0].ranks] == ["torch elastic"] * 2
    assert [r.extra["launch"]["cluster_environment"] for r in cmp.b.runs[0].ranks] == \\
        ["TorchElasticEnvironment"] * 2

def test_a_failing_rank_is_named(distperf):
    distperf.run("lightning_fabric", launch="as_user", workload="launchhelpers:fails_on_rank_one",
                 steps=1, warmup=1)
"""


class InnerSession:
    """One inner pytest session (a subprocess, as pytester's runpytest_subprocess runs one) over several test files:
    its output as a RunResult, each file's outcomes (from its JUnit XML) and its --distperf-json report."""

    def __init__(self, root, result: pytest.RunResult):
        import xml.etree.ElementTree as ET

        self.root, self.result = root, result
        self.by_file: dict[str, dict[str, int]] = {}
        for case in ET.parse(root / "junit.xml").iter("testcase"):
            kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
            # a test that failed and then errored in teardown is one of each, as pytest counts it
            outcomes = [{"failure": "failed", "error": "errors", "skipped": "skipped"}[k] for k in kinds] or ["passed"]
            counts = self.by_file.setdefault(case.get("classname") + ".py", {})  # a module-level test's class name
            for outcome in outcomes:
                counts[outcome] = counts.get(outcome, 0) + 1

    def assert_outcomes(self, file: str, **outcomes: int) -> None:
        """Like RunResult.assert_outcomes, for one file's tests: every outcome not named is 0."""
        assert self.by_file.get(file, {}) == outcomes, self.result.stdout.str()

    def report_tests(self, file: str) -> list[dict]:
        report = json.loads((self.root / "report.json").read_text())
        return [t for t in report["tests"] if t["nodeid"].startswith(file + "::")]


@pytest.fixture(scope="module")
def launch_session(tmp_path_factory: pytest.TempPathFactory) -> InnerSession:
    """The elastic-profile and Lightning test bodies, run in ONE inner session (each costs a session's start and
    its jobs' launches; together they share the start). Each outer test checks its own file's part of it."""
    import os
    import subprocess
    import sys
    import time

    root = tmp_path_factory.mktemp("launch")
    (root / "launchhelpers.py").write_text(HELPERS)
    (root / "test_elastic.py").write_text(ELASTIC_TESTS)
    (root / "test_lightning.py").write_text(LIGHTNING_TESTS)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GITHUB_STEP_SUMMARY", "PYTEST_ADDOPTS", "PYTEST_XDIST"))}
    env["PY_COLORS"] = "0"
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "pytest", *INNER, "--distperf-json", "report.json",
                          "--junitxml", "junit.xml", f"--basetemp={root / 'basetemp'}",
                          "test_elastic.py", "test_lightning.py"],
                         cwd=root, env=env, capture_output=True, text=True, timeout=800)
    result = pytest.RunResult(out.returncode, out.stdout.splitlines(), out.stderr.splitlines(),
                              time.monotonic() - start)
    assert (root / "junit.xml").is_file(), out.stdout + out.stderr
    return InnerSession(root, result)


@pytest.mark.slow
def test_step_jobs_under_each_elastic_profile(launch_session: InnerSession):
    launch_session.assert_outcomes("test_elastic.py", passed=1, failed=1)
    launch_session.result.stdout.fnmatch_lines(
        ["*test_bad_launch*launch='torchrun' is not one of 'controlled', 'as_user'*"])


@pytest.mark.slow
def test_lightning_as_its_users_launch_it(launch_session: InnerSession):
    launch_session.assert_outcomes("test_lightning.py", passed=2, failed=1)
    launch_session.result.stdout.fnmatch_lines([
        "*distperf job lightning_fabric launchhelpers:fails_on_rank_one x2 cpu as_user:lightning failed: rank 1 "
        "exited with code 1 (root cause)*",
        "*RuntimeError: no data for rank one*",
    ])
    report = launch_session.report_tests("test_lightning.py")
    assert '"launch_profile": "lightning"' in json.dumps(report)


# -- pure parts ---------------------------------------------------------------------------------------------------

def test_threads_per_profile_and_a_user_setting_wins():
    def omp(profile, ranks=2, device="cuda", env=None):
        return thread_environment(PROFILES[profile], env or {}, ranks, device, cores=32, physical_cores=16)

    assert omp("controlled") == {"OMP_NUM_THREADS": "16"}
    assert omp("torchrun") == {"OMP_NUM_THREADS": "1"} and omp("torchrun", ranks=1) == {}
    assert omp("deepspeed") == {} and omp("lightning") == {}  # torch's default / Lightning sets it in the rank
    assert omp("accelerate") == {"OMP_NUM_THREADS": "1"}
    assert omp("accelerate", device="cpu") == {"OMP_NUM_THREADS": "8"}
    for name in PROFILES:
        assert omp(name, env={"OMP_NUM_THREADS": "3"}) == {}
    assert resolve("controlled", "lightning").name == "controlled" and resolve("as_user", "lightning").starter == "script"
    assert check_choice("as_user", "x") == "as_user"
    with pytest.raises(UsageError, match="^test_x: launch='user' is not one of 'controlled', 'as_user'$"):
        check_choice("user", "test_x")
