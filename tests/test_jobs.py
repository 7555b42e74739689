"""Real 2-rank CPU jobs started through torch's elastic launcher."""

import re

import pytest

USER_FUNCTIONS = """
import os
import signal
import torch
import torch.distributed as dist

def gather_ranks(scale):
    t = torch.tensor([float(dist.get_rank())])
    out = [torch.zeros(1) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return {"rank": dist.get_rank(), "world": dist.get_world_size(), "seen": [scale * x.item() for x in out],
            "backend": dist.get_backend(), "elastic": "TORCHELASTIC_RUN_ID" in os.environ,
            # CPU ranks are forked from the agent: they must start as a spawned rank would
            "handlers": [signal.getsignal(s) is signal.SIG_DFL for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)]
                        + [signal.getsignal(signal.SIGINT) is signal.default_int_handler],
            "threads": (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))}

def raise_in_rank_one():
    if dist.get_rank() == 1:
        raise ValueError("boom from rank one")
    dist.barrier()
"""


@pytest.mark.slow
def test_user_function_runs_in_every_rank_and_values_come_back(pytester):
    pytester.makepyfile(helpers=USER_FUNCTIONS)
    pytester.makepyfile("""
        import os
        from helpers import gather_ranks

        def test_fn(distperf):
            values = distperf.run_function(gather_ranks, 10)
            assert [v["rank"] for v in values] == [0, 1]
            assert all(v["seen"] == [0.0, 10.0] and v["world"] == 2 and v["backend"] == "gloo" for v in values)
            assert all(v["elastic"] for v in values)  # started by torch elastic
            assert all(v["handlers"] == [True] * 4 for v in values)  # Python's own signal handlers, not the agent's
            assert all(str(v["threads"][0]) == v["threads"][1] for v in values)  # the launch's OMP_NUM_THREADS
            assert not [k for k in os.environ if k.startswith("TORCHELASTIC_")]  # pytest's env untouched
    """)
    pytester.runpytest("--distperf", "-p", "no:cacheprovider").assert_outcomes(passed=1)


@pytest.mark.slow
def test_rank_exception_fails_the_test_with_rank_and_traceback(pytester, monkeypatch, tmp_path):
    temp = tmp_path / "tmp"  # the job's temporary files: torch's error file of the failed rank is not left there
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    pytester.makepyfile(helpers=USER_FUNCTIONS)
    pytester.makepyfile("""
        from helpers import raise_in_rank_one

        def test_fn(distperf):
            distperf.run_function(raise_in_rank_one)
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*failed: rank 1 exited with code 1 (root cause)*",
        "*raise ValueError(\"boom from rank one\")*",
        "*ValueError: boom from rank one*",
    ])
    assert not list(temp.glob("pytorch-errorfile-*")), list(temp.iterdir())


@pytest.mark.slow
def test_a_failed_job_is_not_run_again_for_the_next_test_that_shares_it(pytester):
    # DeepSpeed's own config model rejects the nested key inside the ranks: a real failure, after a launch.
    pytester.makepyfile("""
        import pytest

        @pytest.fixture
        def job(distperf):
            return distperf.job("deepspeed", steps=1, warmup=1,
                                options={"stage": 3, "ds_config": {"zero_optimization": {"stage": 3, "no_such_knob": 1}}})

        def test_first(distperf, job):
            distperf.run(job)

        def test_second(distperf, job):
            distperf.run(job)
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "-rf")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines([
        "*no_such_knob*",
        "*failed earlier in this session, in test_a_failed_job_is_not_run_again_for_the_next_test_that_shares_it.py"
        "::test_first; not run again*",
    ])
    job_folders = set(re.findall(r"job folder \(logs of every rank\): (\S+)", result.stdout.str()))
    assert len(job_folders) == 1, job_folders  # one launch, not two


def test_local_function_is_rejected(pytester):
    pytester.makepyfile("""
        def test_fn(distperf):
            def inner():
                pass
            distperf.run_function(inner)
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*run_function needs a module-level function*"])



def test_a_strategy_option_among_the_jobs_keywords_is_named_with_where_it_goes(pytester):
    pytester.makepyfile("""
        def test_fn(distperf):
            distperf.run("deepspeed", steps=2, stage=3)
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*UsageError: distperf job 'deepspeed': stage is not a keyword of job(); "
                                 "a strategy's own options go in options={'stage': 3}*"])
    result.assert_outcomes(failed=1)


@pytest.mark.slow
def test_two_strategies_on_the_same_data_give_matching_losses(pytester):
    pytester.makepyfile("""
        def test_match(distperf):
            ddp = distperf.job("ddp", steps=3, warmup=1)
            fsdp2 = distperf.job("fsdp2", steps=3, warmup=1)
            cmp = distperf.compare(ddp, fsdp2, repeats=1)
            cmp.assert_losses_match(1e-4)
            run = cmp.a.runs[0]
            assert len(run.step_times) == 3 and all(t > 0 for t in run.step_times)
            assert run.peak_memory > 0 and run.ranks[0].num_params > 900_000
            # DDP keeps full fp32 weights + 2 Adam moments on each of 2 ranks; FSDP2 shards them.
            assert round(cmp.a.runs[0].optimizer_bytes_per_param) == 24
            assert round(cmp.b.runs[0].optimizer_bytes_per_param) == 12
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*= distperf =*", "*ddp tiny x2 cpu*1x3*", "*loss_match*✓ pass*"])


def test_fsdp1_on_cpu_is_skipped_with_the_reason(pytester):
    pytester.makepyfile("""
        def test_fsdp1(distperf):
            distperf.run("fsdp")
    """)
    result = pytester.runpytest("--distperf", "-rs", "-p", "no:cacheprovider")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*FSDP1 (FullyShardedDataParallel) needs a CUDA device*"])
