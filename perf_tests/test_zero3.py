"""DeepSpeed ZeRO-3 against torch FSDP2 on the same model, data, seed and precision policy.

Seed case: deepspeedai/DeepSpeed#3901 ("Training speed is slower and consumes more memory
than FSDP"; Falcon-7B on 8xA100: ZeRO-3 38 GB vs FSDP 23.8 GB per GPU, and with optimizer
and parameter offload 13.7 s vs 2.9 s a step). Shapes follow the device: `tiny` on CPU,
`1b` (1.3B parameters) on CUDA; thresholds are the ones the issue asks for, never tuned.
"""

import pytest

pytestmark = [pytest.mark.distperf(world_size=2), pytest.mark.zero3, pytest.mark.deepspeed, pytest.mark.fsdp]

# Same seed and batches: fp32 on CPU agrees to rounding; bf16 compute on CUDA to bf16 noise.
LOSS_RTOL = {"cpu": 1e-4, "cuda": 2e-2}


def zero3_vs_fsdp2(distperf, offload: bool):
    zero3 = distperf.job("deepspeed", stage=3, offload_optimizer="cpu" if offload else None)
    fsdp2 = distperf.job("fsdp2", offload=offload)
    return distperf.compare(zero3, fsdp2)


def test_zero3_trains_like_fsdp2(distperf):
    zero3_vs_fsdp2(distperf, offload=False).assert_losses_match(LOSS_RTOL[distperf.device])


def test_zero3_step_time_within_1_1x_fsdp2(distperf):
    zero3_vs_fsdp2(distperf, offload=False).assert_step_time_within(1.1)


def test_zero3_peak_memory_within_1_1x_fsdp2(distperf):
    zero3_vs_fsdp2(distperf, offload=False).assert_memory_within(1.1)


@pytest.mark.offload
def test_zero3_offload_step_time_within_1_1x_fsdp2_offload(distperf):
    zero3_vs_fsdp2(distperf, offload=True).assert_step_time_within(1.1)


@pytest.mark.offload
def test_zero3_offload_peak_memory_within_1_1x_fsdp2_offload(distperf):
    zero3_vs_fsdp2(distperf, offload=True).assert_memory_within(1.1)
