"""The work phase (rank/work.py): what a step asks of the machine, beside wall time.

Real jobs: on CPU the counts are exact and equal run to run, FLOPs equal the model's matmuls, and a CPU job has
no GPU figures and says why; on CUDA (skipped without a GPU) kernel time, busy time and kernels are measured.
The gate's and the checks' use of the figures is tested on plain run data.
"""

from __future__ import annotations

import pytest

from pytest_distperf.decide import regression, verdicts
from pytest_distperf.decide.policy import Policy
from pytest_distperf.store.baselines import MetricSeries, metrics_from_runs
from pytest_distperf.figures.quantities import metric_traits
from pytest_distperf.launch.launcher import launch
from pytest_distperf.figures.quantities import job_figures, run_work
from pytest_distperf.rank.results import RankResult, RunResult, WorkResult
from pytest_distperf.spec.job import FunctionRef, JobSpec

WIDTH, BATCH = 32, 8


def make_linear_step(width: int = WIDTH, batch: int = BATCH):
    """A user step with known FLOPs: one Linear, forward and backward, no bias."""
    import torch

    model = torch.nn.Linear(width, width, bias=False)
    x = torch.randn(batch, width)

    def step() -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        return loss.detach()

    return step


def _run(job: JobSpec) -> RunResult:
    values = launch(job, timeout=120)
    return RunResult(spec=job, ranks=[values[r] for r in sorted(values)], wall_seconds=0.0)


def test_a_cpu_job_counts_exact_work_and_says_what_it_cannot_measure(tmp_path):
    import sys

    job = JobSpec(world_size=2, device="cpu", step=FunctionRef(__name__, "make_linear_step", __file__),
                  steps=3, warmup_steps=1, sys_path=list(sys.path))
    runs = [_run(job), _run(job)]
    works = [r.work for run in runs for r in run.ranks]
    # forward x @ W^T and backward's grad of W: two (batch x width x width) matmuls, 2 FLOPs a multiply-add
    assert all(w.flops == [2 * 2 * BATCH * WIDTH * WIDTH] * job.work_steps for w in works)
    assert len({tuple(w.aten_ops) for w in works}) == 1 and works[0].aten_ops[0] > 0
    assert all(w.gpu_time is None and "needs CUDA" in w.not_measured["gpu_time"] for w in works)
    assert run_work(runs[0]) == run_work(runs[1])  # exact, run to run
    metrics = metrics_from_runs(runs)
    assert metrics["flops_per_step"].kind == "count" and metrics["flops_per_step"].runs == [2048.0 * 16] * 2
    assert "gpu_time" not in metrics


def test_a_jobs_later_runs_leave_out_the_counting_pass_and_the_breakdown_but_keep_the_counts_gated():
    import dataclasses
    import sys

    job = JobSpec(world_size=2, device="cpu", strategy="ddp", shape="tiny", steps=3, warmup_steps=1,
                  sys_path=list(sys.path))
    first, later = _run(job), _run(dataclasses.replace(job, measure_once=False))
    assert all(r.step_breakdown and r.work.flops for r in first.ranks)
    assert all(not r.step_breakdown and r.work.flops is None and r.work.aten_ops is None for r in later.ranks)
    assert all(r.work.step_peak_bytes for r in later.ranks)  # the profiler pass runs in every run
    assert job.config_hash() == dataclasses.replace(job, measure_once=False).config_hash()
    metrics = metrics_from_runs([first, later])
    assert metrics["flops_per_step"].runs == [run_work(first)["flops_per_step"]]  # the run that counted
    assert len(metrics["step_time"].runs) == 2 and len(metrics["train_memory"].runs) == 2


@pytest.mark.gpu(reason="kernel time, busy time and kernels are CUDA's")
def test_a_cuda_job_measures_kernel_time_busy_time_and_kernels():
    import sys

    job = JobSpec(world_size=1, device="cuda", strategy="fsdp2", shape="tiny", steps=5, warmup_steps=2,
                  sys_path=list(sys.path))
    run = _run(job)
    w = run.ranks[0].work
    assert w.gpu_time and all(t > 0 for t in w.gpu_time) and w.kernels and min(w.kernels) > 0
    assert all(0 < b <= 1.5 * max(run.step_times) for b in w.gpu_busy)
    f = job_figures("tiny", [run])
    assert f.work["gpu_time"] > 0 and 0 < f.gpu_busy_share <= 1.5


def _run_with(work: WorkResult, step: float = 0.1) -> RunResult:
    rank = RankResult(rank=0, step_times=[step] * 3, losses=[], cuda_peak_allocated=1 << 20, cuda_peak_reserved=None,
                      host_peak_rss=0, host_rss_before_build=0, optimizer_state_bytes=0, num_params=1,
                      tokens_per_step=0, build_seconds=0.0, warmup_seconds=0.0, work=work)
    return RunResult(spec=JobSpec(world_size=1, device="cuda", strategy="recorded"), ranks=[rank], wall_seconds=0.0)


def _series(name: str, values: list[float]) -> MetricSeries:
    return MetricSeries(*metric_traits(name), runs=values)


def test_gpu_time_decides_on_its_own_floor_where_wall_time_cannot():
    """+3 % GPU time at 0.06 % run-to-run fails against the 1 % work floor; the wall-time verdict on the same
    runs stays inconclusive, and both say which figure decided and why."""
    base = [0.07031, 0.07035, 0.07041, 0.07034]
    cur = [x * 1.03 for x in reversed(base)]  # four candidate runs: the budget the issue sets
    wall_base, wall_cur = [0.248, 0.333, 0.270, 0.295], [0.243, 0.253]
    policy = Policy()
    gpu = verdicts.decide_metric("t", "j", "gpu_time", _series("gpu_time", base), _series("gpu_time", cur), policy)
    wall = verdicts.decide_metric("t", "j", "step_time", _series("step_time", wall_base),
                                  _series("step_time", wall_cur), policy)
    assert gpu.status == "fail" and "work_threshold" in gpu.threshold_text and gpu.threshold == 0.01
    assert wall.status == "inconclusive"
    runs = [_run_with(WorkResult(steps=2, gpu_time=[0.07] * 2, gpu_busy=[0.07] * 2), step=t) for t in wall_cur]
    figures = job_figures("j", runs)
    assert figures.host_bound and "host-bound: GPU busy 28% of the step" in figures.host_bound_text()
    regression.note_deciding_figure([wall, gpu], figures)
    assert "the work figures decided (gpu_time FAIL): host-bound" in wall.note
    assert "decided where step time stayed inconclusive" in gpu.note


def test_the_work_threshold_is_a_marker_key():
    from pytest_distperf.decide.policy import policy_for

    assert policy_for(Policy(), {"work_threshold": 0.02}, "t").work_threshold == 0.02
    with pytest.raises(Exception, match="work_threshold"):
        policy_for(Policy(), {"work_threshold": -1}, "t")
