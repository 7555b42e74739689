"""The warm launch agent (agents/warm.py, warm_pool.py), with real CPU launches: a job's results do not
depend on it, every run still gets new rank processes with a fresh launch's threads, a failed or timed-out job
ends the agent and the next job gets a new one, nothing outlives the session, and the distperf_fresh_agent ini key turns
it off."""

from __future__ import annotations

import os
import time

import psutil
import pytest

from pytest_distperf.errors import JobTimeout
from pytest_distperf.launch import warm_pool
from pytest_distperf.launch.launcher import RankFailed, launch
from pytest_distperf.spec.job import FunctionRef, JobSpec


def rank_facts() -> dict:
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    return {"sum": t.item(), "pid": os.getpid(), "agent": os.getppid(), "threads": torch.get_num_threads(),
            "omp": os.environ.get("OMP_NUM_THREADS"), "nvml_check": os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"),
            "cwd": os.getcwd()}


def fail_in_rank_one() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("boom from rank one")
    dist.barrier()


def hang() -> None:
    time.sleep(600)


def _job(fn, world_size: int = 2, **kwargs) -> JobSpec:
    return JobSpec(world_size=world_size, device="cpu", function=FunctionRef(__name__, fn.__name__, __file__),
                   sys_path=[os.path.dirname(__file__)], **kwargs)


@pytest.fixture
def fresh_pool():
    """Each test starts and ends without a warm agent of this process."""
    warm_pool.stop_all()
    yield
    warm_pool.stop_all()


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.slow
def test_warm_and_fresh_launches_give_the_same_results(tmp_path, fresh_pool):
    fresh = launch(_job(rank_facts), timeout=120, base_dir=str(tmp_path), fresh_agent=True)
    warm = launch(_job(rank_facts), timeout=120, base_dir=str(tmp_path))
    assert warm_pool.agent_pids(), "the second job ran through a warm agent"
    skip = ("pid", "agent")
    assert [{k: v for k, v in fresh[r].items() if k not in skip} for r in (0, 1)] == \
           [{k: v for k, v in warm[r].items() if k not in skip} for r in (0, 1)]
    # The agent's own variable does not reach the ranks: they see this process's (lightning_fabric sets it on import,
    # so an earlier test of the session may have).
    assert warm[0]["nvml_check"] == os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK")


@pytest.mark.slow
def test_a_strategy_job_measures_alike_warm_and_fresh(tmp_path, fresh_pool):
    job = JobSpec(world_size=2, device="cpu", strategy="ddp", shape="tiny", steps=3, warmup_steps=1, work_steps=0,
                  sys_path=[os.path.dirname(os.path.dirname(__file__))])
    fresh = launch(job, timeout=300, base_dir=str(tmp_path), fresh_agent=True)
    warm = launch(job, timeout=300, base_dir=str(tmp_path))
    assert [fresh[r].losses for r in (0, 1)] == [warm[r].losses for r in (0, 1)]  # same seed, same training
    assert all(warm[r].build_started_at is not None for r in (0, 1))


@pytest.mark.slow
def test_every_run_gets_new_rank_processes_from_one_warm_agent(tmp_path, fresh_pool):
    runs = [launch(_job(rank_facts), timeout=120, base_dir=str(tmp_path)) for _ in range(3)]
    agents = warm_pool.agent_pids()
    assert len(agents) == 1
    rank_pids = [v["pid"] for values in runs for v in values.values()]
    job_agents = {v["agent"] for values in runs for v in values.values()}
    assert len(set(rank_pids)) == 6  # a new process for every rank of every run
    assert len(job_agents) == 3 and agents[0] not in job_agents  # a job agent of its own each run
    assert all(_gone(p) for p in rank_pids + list(job_agents))


def modules_in_rank() -> dict:
    import sys

    return {"muon": "deepspeed.runtime.zero.muon.muon_optimizer" in sys.modules, "agent": os.getppid()}


@pytest.mark.slow
def test_deepspeeds_first_use_modules_come_with_the_first_job_that_runs_deepspeed(tmp_path, fresh_pool, monkeypatch):
    pytest.importorskip("deepspeed")
    job = _job(modules_in_rank)
    assert warm_pool.job_imports(job) == [] and warm_pool.job_imports(
        JobSpec(world_size=1, device="cpu", strategy="accelerate", options={"engine": "deepspeed"})) == list(
        warm_pool.DEEPSPEED_FIRST_USE) == warm_pool.job_imports(JobSpec(world_size=1, device="cpu", strategy="deepspeed"))
    plain = launch(job, timeout=120, base_dir=str(tmp_path))
    assert not any(v["muon"] for v in plain.values())  # a session without DeepSpeed jobs never pays for them
    (agent,) = warm_pool.agent_pids()
    starts = len(warm_pool.STATE.start_seconds)
    monkeypatch.setattr(warm_pool, "job_imports", lambda job: list(warm_pool.DEEPSPEED_FIRST_USE))  # as DeepSpeed's
    deepspeed_like = launch(job, timeout=300, base_dir=str(tmp_path))
    assert all(v["muon"] for v in deepspeed_like.values())  # imported by the agent before it forked the job
    assert warm_pool.agent_pids() == [agent]  # the same warm agent, its imports counted as its start
    assert len(warm_pool.STATE.start_seconds) == starts + 1 and warm_pool.STATE.start_seconds[-1] > 0


@pytest.mark.slow
def test_forked_ranks_get_the_threads_of_a_fresh_launch(tmp_path, fresh_pool):
    """libgomp read OMP_NUM_THREADS when the warm agent loaded torch: jobs of other rank counts, and a launch
    profile that leaves the variable unset (torch's default), must still get what a fresh launch gives."""
    jobs = [_job(rank_facts, 2), _job(rank_facts, 1), _job(rank_facts, 2, launch_profile="deepspeed"),
            _job(rank_facts, 1, launch_profile="torchrun")]
    for job in jobs:
        fresh = launch(job, timeout=120, base_dir=str(tmp_path), fresh_agent=True)
        warm = launch(job, timeout=120, base_dir=str(tmp_path))
        assert [v["threads"] for v in warm.values()] == [v["threads"] for v in fresh.values()], job.launch_profile
        assert [v["omp"] for v in warm.values()] == [v["omp"] for v in fresh.values()]
    assert len(warm_pool.agent_pids()) == 1  # one agent served them all


@pytest.mark.slow
def test_a_failed_job_ends_the_warm_agent_and_the_next_job_gets_a_new_one(tmp_path, fresh_pool):
    launch(_job(rank_facts), timeout=120, base_dir=str(tmp_path))
    (first,) = warm_pool.agent_pids()
    with pytest.raises(RankFailed, match="boom from rank one"):
        launch(_job(fail_in_rank_one), timeout=120, base_dir=str(tmp_path))
    assert _gone(first) and not warm_pool.agent_pids()
    values = launch(_job(rank_facts), timeout=120, base_dir=str(tmp_path))
    assert values[0]["sum"] == 3.0
    (second,) = warm_pool.agent_pids()
    assert second != first


@pytest.mark.slow
def test_a_timed_out_job_ends_the_warm_agent_with_every_ranks_stack(tmp_path, fresh_pool):
    launch(_job(rank_facts), timeout=120, base_dir=str(tmp_path))
    (first,) = warm_pool.agent_pids()
    with pytest.raises(JobTimeout) as info:
        launch(_job(hang), timeout=4, base_dir=str(tmp_path))
    assert "hang" in str(info.value)  # the ranks' Python stacks (faulthandler) are in the message
    assert _gone(first) and not warm_pool.agent_pids()
    assert launch(_job(rank_facts), timeout=120, base_dir=str(tmp_path))[1]["sum"] == 3.0


@pytest.mark.slow
def test_a_killed_warm_agent_is_replaced_by_the_next_job(tmp_path, fresh_pool):
    launch(_job(rank_facts), timeout=120, base_dir=str(tmp_path))
    (first,) = warm_pool.agent_pids()
    psutil.Process(first).kill()
    psutil.Process(first).wait(10)
    assert launch(_job(rank_facts), timeout=120, base_dir=str(tmp_path))[0]["sum"] == 3.0
    assert warm_pool.agent_pids() and warm_pool.agent_pids()[0] != first


SESSION_TEST = """
import json, os
from pytest_distperf.launch import warm_pool
from helpers import rank_facts

def test_jobs(distperf):
    values = [distperf.run_function(rank_facts) for _ in range(2)]
    pids = {"agents": warm_pool.agent_pids(), "ranks": [v["pid"] for vs in values for v in vs]}
    with open(os.environ["PIDS_FILE"], "w") as f:
        json.dump(pids, f)
"""


def _session(pytester, monkeypatch, *args: str):
    helpers = open(__file__).read()
    pytester.makepyfile(helpers=helpers, test_session=SESSION_TEST)
    pids = pytester.path / "pids.json"
    monkeypatch.setenv("PIDS_FILE", str(pids))
    monkeypatch.setenv("DISTPERF_LOCK_DIR", str(pytester.path / "locks"))  # no wait for other sessions' jobs
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's plugin, not an installed one
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("--distperf", "-p", "no:cacheprovider", "-s", *args)
    import json

    return result, json.loads(pids.read_text())


@pytest.mark.slow
def test_no_warm_agent_or_rank_outlives_the_session(pytester, monkeypatch):
    result, pids = _session(pytester, monkeypatch)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["distperf: agent: warm (*", "distperf: agent: 1 warm agent(s) served 2 job(s)*"])
    assert len(pids["agents"]) == 1
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(_gone(p) for p in pids["agents"] + pids["ranks"]):
        time.sleep(0.1)
    assert all(_gone(p) for p in pids["agents"] + pids["ranks"])


@pytest.mark.slow
def test_fresh_agent_option_starts_a_new_agent_per_job(pytester, monkeypatch):
    result, pids = _session(pytester, monkeypatch, "-o", "distperf_fresh_agent=true")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["distperf: agent: fresh, a new agent process per job (distperf_fresh_agent = true)"])
    assert pids["agents"] == []
    assert "warm agent(s) served" not in result.stdout.str()


@pytest.mark.slow
def test_fresh_agent_ini_option(pytester, monkeypatch):
    pytester.makeini("[pytest]\ndistperf_fresh_agent = true\n")
    result, pids = _session(pytester, monkeypatch)
    result.assert_outcomes(passed=1)
    assert pids["agents"] == []


SEVERAL_TESTS = """
import json, os
import pytest
from pytest_distperf.launch import warm_pool

def facts():
    return {"test": os.environ.get("PYTEST_CURRENT_TEST"), "agent": os.getppid()}

@pytest.mark.parametrize("i", range(3))
def test_job(distperf, i):
    values = distperf.run_function(facts)
    with open(os.environ["PIDS_FILE"] + str(i), "w") as f:
        json.dump({"agents": warm_pool.agent_pids(), "seen": [v["test"] for v in values]}, f)
"""


@pytest.mark.slow
def test_jobs_of_several_tests_share_one_warm_agent(pytester, monkeypatch):
    """PYTEST_CURRENT_TEST differs per test: it is a job's variable, not part of the warm agent's key (it was, and
    every test's run_function paid a new agent's imports); each job's ranks still see their own test's name."""
    import json

    pytester.makepyfile(test_several=SEVERAL_TESTS)
    monkeypatch.setenv("PIDS_FILE", str(pytester.path / "pids"))
    monkeypatch.setenv("DISTPERF_LOCK_DIR", str(pytester.path / "locks"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("--distperf", "-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines(["distperf: agent: 1 warm agent(s) served 3 job(s)*"])
    runs = [json.loads((pytester.path / f"pids{i}").read_text()) for i in range(3)]
    assert len({tuple(r["agents"]) for r in runs}) == 1 and len(runs[0]["agents"]) == 1
    for i, r in enumerate(runs):
        assert r["seen"] == [f"test_several.py::test_job[{i}] (call)"] * 2


def test_the_warm_agent_key_leaves_out_only_the_per_job_variables():
    env = {"PYTHONPATH": "/a", "OMP_NUM_THREADS": "1", "PYTEST_CURRENT_TEST": "t.py::a (call)"}
    key = warm_pool.agent_key("cpu", env)
    assert warm_pool.agent_key("cpu", {**env, "PYTEST_CURRENT_TEST": "t.py::b (call)", "OMP_NUM_THREADS": "2"}) == key
    assert warm_pool.agent_key("cpu", {**env, "PYTHONPATH": "/b"}) != key  # one agent per environment
    assert warm_pool.agent_key("cuda", env) != key  # and per device kind
    # DeepSpeed's CUDA jobs get the arch list without letter suffixes; read only when an op builds, in a rank
    cuda = {**env, "TORCH_CUDA_ARCH_LIST": "9.0a"}
    assert warm_pool.agent_key("cuda", {**cuda, "TORCH_CUDA_ARCH_LIST": "9.0"}) == warm_pool.agent_key("cuda", cuda)


def test_a_runs_wall_time_splits_into_start_up_build_warm_up_timed_after_timing_and_the_rest():
    from pytest_distperf.figures.quantities import job_time_split, run_time_split, time_split_text
    from pytest_distperf.rank.results import RankResult, RunResult

    def rank(r: int, started: float, build: float) -> RankResult:
        return RankResult(rank=r, step_times=[0.5, 0.5], losses=[], cuda_peak_allocated=None, cuda_peak_reserved=None,
                          host_peak_rss=0, host_rss_before_build=0, optimizer_state_bytes=0, num_params=1,
                          tokens_per_step=1, build_seconds=build, warmup_seconds=1.0, build_started_at=started,
                          after_seconds=0.5 + r)

    spec = JobSpec(world_size=2, device="cpu", strategy="ddp")
    # 12 s of which 2 s waited for the slot: its own 10 s; the latest rank began building 3 s after the launch, and
    # the build ends with the last rank's (at 104.5: rank 1 began at 103 and built 1.5 s; rank 0 ended at 104)
    run = RunResult(spec=spec, ranks=[rank(0, 102.0, 2.0), rank(1, 103.0, 1.5)], wall_seconds=12.0,
                    slot_wait_seconds=2.0, launched_at=100.0)
    # after timing: the slowest rank's work figures, probes and breakdown (1.5 s); other: the rest
    assert run_time_split(run) == {"wall": 10.0, "startup": 3.0, "build": 1.5, "warmup": 1.0, "timed": 1.0,
                                   "after": 1.5, "other": 2.0}
    split = job_time_split([run, run])
    assert split["wall"] == 20.0 and split["startup_share"] == 0.3 and split["timed_share"] == 0.1
    assert time_split_text(split).startswith("20.0 s of runs: start-up (launch to the build) 6.0 s (30%)")
    # the run that started the session's warm agent: its 4 s of imports are the session's, not the run's
    first = RunResult(spec=spec, ranks=run.ranks, wall_seconds=16.0, slot_wait_seconds=2.0, launched_at=96.0,
                      agent_start_seconds=4.0)
    assert run_time_split(first) == run_time_split(run)
    # the run before which the session built DeepSpeed's ops: the build is the session's, not the run's
    built = RunResult(spec=spec, ranks=run.ranks, wall_seconds=92.0, slot_wait_seconds=2.0, launched_at=100.0,
                      op_build_seconds=80.0)
    assert run_time_split(built) == run_time_split(run)
    unrecorded = RunResult(spec=spec, ranks=run.ranks, wall_seconds=12.0)  # no launch time: no split, not a guess
    assert run_time_split(unrecorded) is None and job_time_split([run, unrecorded]) == {}
