"""DeepSpeed ZeRO-3's collectives against torch FSDP2's on the same model: how many, how big, how hidden.

Seed cases: deepspeedai/DeepSpeed#5047 ("ZeRO3 launches too many all_gathers") and the report
"DeepSpeed is slower than FSDP" (world size 32, bf16, prefetch bucket 5e7, persistence threshold
1e5), where ZeRO-3's all-gathers were "very fragmented" and "not overlapping" with compute.
Step time says "slower"; these checks say why. Counts, sizes and overlap come from the probe
phase (a few profiled steps after the timing phase); each job runs once per session and the
tests share it. The thresholds are the ones the issue asks for, never tuned to pass.
"""

import pytest

pytestmark = [pytest.mark.distperf(world_size=2), pytest.mark.zero3, pytest.mark.comm, pytest.mark.deepspeed,
              pytest.mark.fsdp]

ALL_GATHER_RATIO = 1.5  # ZeRO-3 all-gathers per step at most 1.5x FSDP2's
OVERLAP_FLOOR = 0.5  # at least half of the communication-kernel time hidden under compute kernels
PROBES = ("comms", "overlap")


# Counts on CUDA are NCCL kernels on the GPU timeline (rank/probes/comms.py says why not the profiler's c10d ops).
GAP_ALL_GATHERS = {
    "cpu": "deepspeedai/DeepSpeed#5047 (ZeRO-3 launches one all-gather per parameter): measured 3.33x "
           "(20 vs 6 all-gathers per step per rank, median 32.25 KiB vs 770 KiB), tiny on 2 CPU ranks",
    "cuda": "deepspeedai/DeepSpeed#5047 (ZeRO-3 launches one all-gather per parameter): measured 2.88x "
            "(144 vs 50 NCCL all-gather kernels per step per rank, median 4.00 KiB vs 96.02 MiB), 1b on 2xH200, "
            "DeepSpeed 0.19.8",
}
GAP_OVERLAP_ZERO3 = ("deepspeedai/DeepSpeed#5047 (ZeRO-3's all-gathers \"not overlapping\" with compute): measured "
                     "4.2%, 8.1%, 16.4% and 24.8% (four runs) of NCCL kernel time under compute kernels, 1b on 2xH200, "
                     "DeepSpeed 0.19.8")


def probed(distperf, strategy: str, **options):
    if distperf.world_size < 2:  # before any run: one rank calls no collective
        pytest.skip(f"collectives need 2 or more ranks; this session runs {distperf.world_size}")
    return distperf.probe(distperf.job(strategy, options=options, steps=3, probes=PROBES), shared=True)


@pytest.mark.distperf(known_gap=GAP_ALL_GATHERS)
def test_zero3_all_gathers_per_step_within_1_5x_fsdp2(distperf):
    zero3 = probed(distperf, "deepspeed", stage=3)
    fsdp2 = probed(distperf, "fsdp2")
    distperf.probe_checks(zero3, fsdp2).assert_collectives_within("all_gather", ALL_GATHER_RATIO)


@pytest.mark.parametrize("strategy,options", [
    pytest.param("deepspeed", {"stage": 3}, id="zero3", marks=pytest.mark.distperf(known_gap={"cuda": GAP_OVERLAP_ZERO3})),
    pytest.param("fsdp2", {}, id="fsdp2"),
])
def test_comm_overlap_at_least_half(distperf, strategy, options):
    # On CPU this skips: overlap is read from NCCL and compute kernels on the GPU timeline.
    distperf.probe_checks(probed(distperf, strategy, **options)).assert_overlap_at_least(OVERLAP_FLOOR)
