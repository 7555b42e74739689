"""DeepSpeed ZeRO-3 against torch FSDP2 on the same model, data, seed and precision policy.

Seed case: deepspeedai/DeepSpeed#3901 ("Training speed is slower and consumes more memory
than FSDP"; Falcon-7B on 8xA100: ZeRO-3 38 GB vs FSDP 23.8 GB per GPU, and with optimizer
and parameter offload 13.7 s vs 2.9 s a step). Shapes follow the device: `tiny` on CPU,
`1b` (1.3B parameters) on CUDA, the offloaded pair `350m` (OFFLOAD_SHAPE); thresholds are the ones
the issue asks for, never tuned.
"""

import pytest

pytestmark = [pytest.mark.distperf(world_size=2), pytest.mark.zero3, pytest.mark.deepspeed, pytest.mark.fsdp]

# Known upstream gaps, measured with this suite (strict xfails: an upstream fix turns them into XPASS failures,
# so the mark gets removed; only a failed check counts as the expected failure, a crash still fails).
GAP_TIME_CUDA = ("deepspeedai/DeepSpeed#3901 and #5047 (ZeRO-3 gathers parameter by parameter, little overlap): "
                 "measured 1.65x [1.41, 1.92] FSDP2's step time (266.7 vs 161.6 ms), 1b on 2xH200, DeepSpeed 0.19.8, "
                 "torch 2.11")
# On the 2-core CPU box the step-time gap has been decided both ways, failing under other load and passing on a
# quiet box: not strict there.
GAP_TIME_CPU = ("deepspeedai/DeepSpeed#3901 and #5047 on CPU (ZeRO-3 all-gathers its persistent parameters one "
                "collective each after every step), load-dependent on the 2-core box: measured 1.190x [1.129, 1.255] "
                "and 1.217x [1.102, 1.344] FSDP2's step time in earlier sessions, 1.031x [0.971, 1.094] (6 pairs, a "
                "pass) on the quiet box, tiny on 2 CPU ranks, DeepSpeed 0.19.8, torch 2.13")
GAP_OFFLOAD_TIME_CPU = ("deepspeedai/DeepSpeed#3901 on CPU: ZeRO-3 with DeepSpeedCPUAdam against FSDP2 with "
                        "CPUOffloadPolicy, measured 1.191x [1.119, 1.267] (12 pairs) and 1.240x [1.149, 1.339] "
                        "(4 pairs) FSDP2's step time, tiny on 2 CPU ranks of the 2-core box, DeepSpeed 0.19.8")
# The memory gaps are CUDA's only. On CPU a memory check decides on the training state (train_memory: parameters,
# gradients, optimizer state + a step's allocation peak), where ZeRO-3 holds what FSDP2 holds: measured 1.015x
# [1.015, 1.015] (31.24 vs 30.77 MiB, 3 pairs) and 1.027x [0.973, 1.085] (vs 30.41 MiB, 6 pairs: FSDP2's step peak
# varies a little run to run) in two sessions, 1.015x [1.015, 1.015] in both with offload, tiny on 2 CPU ranks,
# DeepSpeed 0.19.8, torch 2.13 -- a plain check there. The CPU gaps declared before (1.78x and 1.75x) were host RSS
# growth (shown beside it now: 1.68-1.72x and 1.67-1.74x in those sessions): mostly DeepSpeed's one-time engine
# allocations.
GAP_MEMORY = {
    "cuda": "deepspeedai/DeepSpeed#3901 (ZeRO-3 uses more GPU memory than FSDP): measured 1.26x "
            "(28.82 vs 22.93 GiB peak allocated), 1b on 2xH200, DeepSpeed 0.19.8, torch 2.11",
}
GAP_OFFLOAD_MEMORY = {
    "cuda": "deepspeedai/DeepSpeed#3901: with the optimizer offloaded, measured 1.30x (20.06 vs 15.42 GiB peak "
            "allocated), 1b on 2xH200, and 1.265x (11.59 vs 9.16 GiB), 350m on 1xH200, DeepSpeed 0.19.8, torch 2.11",
}

# Same seed and batches: fp32 on CPU agrees to rounding (benchmarks/loss_noise.py --device cpu: 0 on every row). On
# CUDA both compute in bf16, each engine rounding in its own places, and even in fp32 two correct engines drift apart
# (atomics order a run's reductions their own way; the drift grows with the steps). Step by step
# |A - B| <= d_zero3 + fp32 gap + d_fsdp2 (the triangle through each side's fp32 run; d_s: how far bf16 moves
# strategy s's curve from its fp32 one), measured at the pair's timed steps on CUDA (STEPS), 1b on 1xH200:
# d_zero3 0.0198 + fp32 gap 0.0163 + d_fsdp2 0.0224 = 0.0585 at 20 steps (the two in bf16: 0.0252 apart).
LOSS_RTOL = {"cpu": 1e-4, "cuda": 0.0585}


# The offloaded pair on CUDA at 350m: where the optimizer runs and what crosses PCIe scale with the parameters
# alike at either size, and a 1b pair costs about three times as long (DeepSpeedCPUAdam over 1.3B parameters).
OFFLOAD_SHAPE = {"cpu": "tiny", "cuda": "350m"}


# Timed steps a run. On CUDA a 1b ZeRO-3 step varies by a quarter from step to step (p10-p90 235-302 ms on 1xH200),
# and a run's start-up, build, warm-up and work phase cost 4-11 s whatever the steps: 20 steps halve the median's
# sampling variance for 1.6-2.7 s more a run, and timed steps become 40 % (FSDP2) and a third (ZeRO-3) of a run.
STEPS = {"cpu": 10, "cuda": 20}


def zero3_vs_fsdp2(distperf, offload: bool):
    shape, steps = (OFFLOAD_SHAPE, 10) if offload else (None, STEPS[distperf.device])
    zero3 = distperf.job("deepspeed", options={"stage": 3, "offload_optimizer": "cpu" if offload else None},
                         shape=shape, steps=steps)
    fsdp2 = distperf.job("fsdp2", options={"offload": offload}, shape=shape, steps=steps)
    return distperf.compare(zero3, fsdp2, shared=True)  # the four checks share one set of runs


def test_zero3_trains_like_fsdp2(distperf):
    zero3_vs_fsdp2(distperf, offload=False).assert_losses_match(LOSS_RTOL[distperf.device])


# An undecided verdict reads "neither confirmed nor refuted"; on CPU a pass is an XPASS, not a failure.
@pytest.mark.distperf(known_gap={"cuda": GAP_TIME_CUDA, "cpu": GAP_TIME_CPU}, known_gap_strict={"cpu": False})
def test_zero3_step_time_within_1_1x_fsdp2(distperf):
    zero3_vs_fsdp2(distperf, offload=False).assert_step_time_within(1.1)


@pytest.mark.distperf(known_gap=GAP_MEMORY)
def test_zero3_peak_memory_within_1_1x_fsdp2(distperf):
    zero3_vs_fsdp2(distperf, offload=False).assert_memory_within(1.1)


@pytest.mark.offload
@pytest.mark.distperf(known_gap={"cpu": GAP_OFFLOAD_TIME_CPU})
def test_zero3_offload_step_time_within_1_1x_fsdp2_offload(distperf):
    zero3_vs_fsdp2(distperf, offload=True).assert_step_time_within(1.1)


@pytest.mark.offload
@pytest.mark.distperf(known_gap=GAP_OFFLOAD_MEMORY)
def test_zero3_offload_peak_memory_within_1_1x_fsdp2_offload(distperf):
    zero3_vs_fsdp2(distperf, offload=True).assert_memory_within(1.1)
