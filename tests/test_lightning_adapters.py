"""Lightning Trainer, Lightning Fabric and Accelerate adapters, and the step breakdown.

Real 2-rank CPU jobs through the plugin's launcher: each front-end that can run on CPU
(their DDP engines) trains the workload with the raw DDP adapter's losses, inside the ranks
torch elastic started (the adapters check that Lightning/Accelerate reused them). The
combinations that need CUDA skip with the reason. The breakdown and its failure message
are checked on plain numbers.
"""

import os

import pytest

from pytest_distperf import strategies
from pytest_distperf.strategies import ds_ops

from pytest_distperf.rank import breakdown
from pytest_distperf.decide.checks import Comparison, DistPerfCheckFailed
from pytest_distperf.figures.quantities import JobRuns
from pytest_distperf.spec.job import JobSpec
from pytest_distperf.figures.quantities import breakdown_lines
from pytest_distperf.rank.results import RankResult, RunResult

FRONTEND_VS_DDP = """
import pytest

pytestmark = pytest.mark.distperf(world_size=2, device="cpu", repeats=1)


def test_trains_like_raw_ddp(distperf):
    cmp = distperf.compare(distperf.job("{name}", steps=3, warmup=1), distperf.job("ddp", steps=3, warmup=1))
    cmp.assert_losses_match(1e-4)  # same seed, batches, fp32 ops: equal up to rounding
    front, raw = cmp.a.runs[0], cmp.b.runs[0]
    assert len(front.step_times) == 3 and all(t > 0 for t in front.step_times)
    assert front.optimizer_bytes_per_param == raw.optimizer_bytes_per_param  # same fp32 AdamW, unsharded
    for run in (front, raw):  # the breakdown phase ran on every rank, after timing
        for r in run.ranks:
            b = r.step_breakdown
            assert set(b) == {{"forward", "backward", "optimizer", "other", "total"}}
            assert b["forward"] > 0 and b["backward"] > 0 and b["optimizer"] > 0
            assert b["total"] >= b["forward"] + b["backward"] + b["optimizer"]
"""


# pytester points HOME at a fresh folder, which would make DeepSpeed JIT-build its CPU Adam op again
# (minutes) in every inner run: keep the ranks on the user's op cache, read before any test changes HOME.
TORCH_EXTENSIONS_DIR = ds_ops.cache_dir()

DS_OPTIMIZER_HELPERS = """
import deepspeed
import torch
import torch.distributed as dist

from pytest_distperf.strategies import RankContext, ds_config, frontend
from pytest_distperf.rank.workload import build_model, make_batches, resolve_shape


def one_step_each_way(offload):
    # The raw adapter's route (DeepSpeed builds the optimizer from the config) against the Lightning
    # adapters' route (the same config without "optimizer", plus frontend.split_optimizer's client optimizer).
    shape = resolve_shape("tiny")
    ctx = RankContext(rank=dist.get_rank(), local_rank=dist.get_rank(), world_size=2, device=torch.device("cpu"),
                      micro_batch=shape.micro_batch, scratch_dir="/tmp")
    config = ds_config.rank_config(ctx, lr=1e-3, weight_decay=0.01, stage=2, offload_optimizer=offload,
                                       offload_param=None, nvme_path=None, ds_config={})
    client_config, make = frontend.split_optimizer(config)
    batch = make_batches(shape, 1234, ctx.rank, 1, ctx.device)[0]
    out = []
    for cfg, client in ((config, False), (client_config, True)):
        model = build_model(shape, 1234, ctx.device)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg,
                                          optimizer=make(model.parameters()) if client else None)
        inner = engine.optimizer.optimizer
        group = {k: v for k, v in inner.param_groups[0].items() if k != "params"}
        engine.backward(engine(*batch))
        engine.step()
        out.append((type(inner).__name__, getattr(inner, "adam_w_mode", None), group, float(engine(*batch))))
    return out
"""


@pytest.mark.slow
@pytest.mark.parametrize("offload", [None, "cpu"])
def test_lightning_deepspeed_optimizer_is_the_one_deepspeed_builds_from_the_config(pytester, monkeypatch, offload):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", TORCH_EXTENSIONS_DIR)
    pytester.makepyfile(helpers=DS_OPTIMIZER_HELPERS)
    pytester.makepyfile(f"""
        import pytest
        from helpers import one_step_each_way

        @pytest.mark.distperf(world_size=2, device="cpu")
        def test_same_optimizer(distperf):
            for (raw, client) in distperf.run_function(one_step_each_way, {offload!r}):
                assert raw[:3] == client[:3]  # class, AdamW mode, lr/betas/eps/weight_decay/...
                assert raw[3] == client[3]  # the same update: the same loss after one step
    """)
    pytester.runpytest("--distperf", "-p", "no:cacheprovider").assert_outcomes(passed=1)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["lightning_trainer", "lightning_fabric", "accelerate"])
def test_frontend_ddp_trains_like_raw_ddp_on_cpu(pytester, name):
    pytester.makepyfile(FRONTEND_VS_DDP.format(name=name))
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


@pytest.mark.slow
def test_trainer_runs_its_loop_on_the_rank_main_thread(pytester):
    # Where users run Trainer.fit: a loop on a second thread ran the reporter's CPU-offloaded optimizer of
    # Lightning-AI/pytorch-lightning#18336 much slower (benchmarks/seed004_reporter.py --fit-thread).
    pytester.makepyfile(loopthread="""
        import threading

        import torch
        from pytest_distperf.rank.workload import build_model, make_batch, resolve_shape
        from pytest_distperf.spec.workloads import Workload

        def main_thread_only():
            shape = resolve_shape("tiny")

            def loss(model, batch):
                thread = threading.current_thread()
                if thread is not threading.main_thread():
                    raise RuntimeError(f"the training loop ran on thread {thread.name!r}, not the main thread")
                return model(*batch)

            return Workload(model=lambda: build_model(shape, 1234, torch.device("cpu")),
                            batch=lambda step, rank: make_batch(shape, 1234, step, rank),
                            loss=loss)
    """)
    pytester.makepyfile("""
        import pytest

        pytestmark = pytest.mark.distperf(world_size=2, device="cpu", repeats=1)

        def test_loop_thread(distperf):
            run = distperf.run(distperf.job("lightning_trainer", workload="loopthread:main_thread_only",
                                            steps=2, warmup=1))
            assert len(run.ranks[0].step_times) == 2
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_cuda_only_combinations_skip_on_cpu_with_the_reason(pytester):
    pytester.makepyfile("""
        import pytest

        pytestmark = pytest.mark.distperf(world_size=2, device="cpu")

        @pytest.mark.parametrize("name", ["lightning_trainer", "lightning_fabric"])
        @pytest.mark.parametrize("opts", [dict(engine="fsdp", offload=True), dict(engine="deepspeed", stage=2)])
        def test_lightning(distperf, name, opts):
            distperf.job(name, options=opts)

        @pytest.mark.parametrize("opts", [dict(engine="fsdp"), dict(engine="fsdp", offload=True),
                                          dict(engine="deepspeed")])
        def test_accelerate(distperf, opts):
            distperf.job("accelerate", options=opts)
    """)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=7)
    result.stdout.fnmatch_lines([
        "*Lightning's FSDPStrategy needs CUDA*",
        "*Lightning's DeepSpeedStrategy needs CUDA*",
        "*Accelerate ignores its FSDP plugin on CPU*MULTI_CPU*",
        "*Accelerate ignores its DeepSpeed plugin on CPU*",
    ])


@pytest.mark.parametrize("options, needle", [
    (dict(engine="megatron"), "engine='megatron' is not one of"),
    (dict(engine="ddp", stage=2), "'stage' do not apply to engine='ddp'"),
    (dict(engine="fsdp", offload_optimizer="cpu"), "'offload_optimizer' do not apply to engine='fsdp'"),
    (dict(engine="deepspeed", stage=2, offload_param="cpu"), "offload_param needs stage=3"),
    (dict(engine="deepspeed", ds_config={"zero_optimisation": {}}), "unknown top-level key"),
    (dict(engine="fsdp", sharding="ALL"), "sharding='ALL'"),
])
def test_frontend_options_are_checked_before_any_rank_starts(options, needle):
    for name in ("lightning_trainer", "lightning_fabric", "accelerate"):
        with pytest.raises(strategies.StrategyError, match=needle.replace("(", r"\(").replace("[", r"\[")):
            strategies.validate(name, options)


def test_phase_clock_splits_a_step_and_keeps_the_rest_as_other():
    syncs = []
    clock = breakdown.PhaseClock(lambda: syncs.append(1))
    clock.start()
    clock.lap("forward")
    clock.lap("backward")
    clock.lap("optimizer")
    out = clock.stop()
    assert len(syncs) == 5  # every boundary waits for the device
    assert set(out) == set(breakdown.ALL_KEYS)
    assert out["total"] == pytest.approx(out["forward"] + out["backward"] + out["optimizer"] + out["other"])


def test_the_median_step_is_kept_whole_so_its_phases_add_up():
    steps = [dict(forward=3.0, backward=1.0, optimizer=1.0, other=0.0, total=5.0),
             dict(forward=1.0, backward=3.0, optimizer=1.0, other=0.0, total=5.5),
             dict(forward=1.0, backward=1.0, optimizer=9.0, other=0.0, total=11.0)]
    assert breakdown.median_step(steps) == steps[1]
    assert breakdown.median_step([]) == {}


def _run(step: float, phases: dict[str, float] | None) -> RunResult:
    spec = JobSpec(world_size=2, device="cpu", strategy="ddp")
    ranks = [RankResult(rank=r, step_times=[step] * 3, losses=[1.0] * 3, cuda_peak_allocated=None,
                        cuda_peak_reserved=None, host_peak_rss=200, host_rss_before_build=100,
                        optimizer_state_bytes=1200, num_params=100, tokens_per_step=512, build_seconds=0.0,
                        warmup_seconds=0.0, step_breakdown=dict(phases or {})) for r in range(2)]
    if phases:  # rank 1 is slower in the optimizer: a run reports its slowest rank
        ranks[1].step_breakdown["optimizer"] += 0.5
        ranks[1].step_breakdown["total"] += 0.5
    return RunResult(spec=spec, ranks=ranks, wall_seconds=1.0)


def test_failing_step_time_check_says_where_the_time_goes():
    slow = dict(forward=0.1, backward=0.2, optimizer=1.5, other=0.05, total=1.85)
    fast = dict(forward=0.1, backward=0.2, optimizer=0.3, other=0.01, total=0.61)
    a = JobRuns("lightning_trainer[engine=fsdp]", [[_run(2.3, slow), _run(2.3, slow)]])
    b = JobRuns("lightning_fabric[engine=fsdp]", [[_run(1.0, fast), _run(1.0, fast)]])
    with pytest.raises(DistPerfCheckFailed) as info:
        Comparison(a, b).assert_step_time_within(1.1)
    msg = str(info.value)
    assert "where the time goes" in msg
    assert "A lightning_trainer[engine=fsdp]: forward 100.0 ms | backward 200.0 ms | optimizer 2.000 s" in msg
    assert "B lightning_fabric[engine=fsdp]: forward 100.0 ms | backward 200.0 ms | optimizer 800.0 ms" in msg
    assert "optimizer +1.200 s" in msg and "largest share of the gap is in 'optimizer'" in msg


def test_no_breakdown_lines_when_a_side_has_none_or_the_check_passes():
    phases = dict(forward=1.0, backward=0.5, optimizer=0.4, other=0.1, total=2.0)
    with_b = JobRuns("A", [[_run(2.0, phases), _run(2.0, phases)]])  # two pairs: one has no interval
    without = JobRuns("B", [[_run(1.0, None), _run(1.0, None)]])
    with pytest.raises(DistPerfCheckFailed) as info:
        Comparison(with_b, without).assert_step_time_within(1.1)
    assert "where the time goes" not in str(info.value)
    assert breakdown_lines(with_b, without) == []
    Comparison(with_b, with_b).assert_step_time_within(1.1)  # passes: nothing to explain
