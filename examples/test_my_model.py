"""A user's own model under FSDP2 and DeepSpeed ZeRO-3, with a baseline.

    pytest examples --distperf                   # CPU + gloo (2 ranks) by default; CUDA + NCCL with 2 GPUs
    pytest examples --distperf --distperf-save   # record this machine's baselines (baselines/<machine-class>/)
    pytest examples --distperf                   # later: every job's step time and memory against them

The workload factory lives in my_model.py (ranks import it by name); FSDP2 shards it per `Block`, ZeRO-3
builds it partitioned inside deepspeed.zero.Init.
"""

import pytest

pytestmark = pytest.mark.distperf(world_size=2)

WORKLOAD = "my_model:make_workload"


def zero3(distperf, **kw):
    return distperf.job("deepspeed", options={"stage": 3, "zero_init": True}, workload=WORKLOAD, **kw)


def fsdp2(distperf, **kw):
    return distperf.job("fsdp2", workload=WORKLOAD, **kw)


def test_both_sides_train_the_same_model_on_the_same_data(distperf):
    # The first step from the seeded weights gives the same loss on both sides: exactly in fp32 on CPU, to bf16
    # noise on CUDA. (Later steps part by more than rounding: this small regression net's training amplifies the
    # engines' differently rounded reductions.)
    first = dict(steps=1, warmup=0)
    rtol = 1e-6 if distperf.device == "cpu" else 2e-2
    distperf.compare(zero3(distperf, **first), fsdp2(distperf, **first), repeats=1).assert_losses_match(rtol)


def test_zero3_step_time_within_1_1x_fsdp2(distperf):
    distperf.compare(zero3(distperf), fsdp2(distperf)).assert_step_time_within(1.1)


def test_fsdp2_against_its_baseline(distperf):
    # Run-level repeats (the marker's or --distperf-repeats) let the gate tell a regression from drift.
    distperf.measure(fsdp2(distperf, workload_kwargs={"depth": 6}))
