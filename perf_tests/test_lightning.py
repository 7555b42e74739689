"""Lightning Trainer vs Lightning Fabric, and Fabric / Accelerate vs the raw strategies.

Seed case: Lightning-AI/pytorch-lightning#18336 ("Investigate FSDP + CPU Offload
performance in Trainer", open): on the same 1B-parameter transformer with FSDP and CPU
offload on 2 GPUs, Fabric ran 0.3 it/s and the Trainer 0.02 it/s. Each pair runs the same
engine, configured the same way (strategies/frontend.py), on the same workload, seed,
batches and precision, so the ratio is what the front-end adds. A failing step-time check
says where the time goes (forward / backward / optimizer / the loop's other work).
On 2xH200 at 350m the Trainer/Fabric FSDP + CPU offload ratio was 0.85x [0.71, 1.02] once each
rank had its share of the cores (launcher.threads_per_rank); with torch's default of every core
in every rank it read 13.7x, an artifact of the oversubscribed host, not of Lightning. At the
issue's 1B size (1b, 1.34B parameters) it read 0.752x [0.713, 0.793] (Trainer 1.489 s, Fabric
2.008 s a step; Lightning 2.6.6, torch 2.11). Fabric is the slower one: at 350m the step breakdown
puts the whole difference in backward (Fabric 143-153 ms, Trainer 76-81 ms; forward and optimizer
equal), not yet traced further -- a fabric_vs_raw pair with offload would say whether it is Fabric's.

Shapes follow the device (`tiny` on CPU, `350m` on CUDA: what a front-end adds to a step does not grow
with the model, so a smaller model shows it no smaller, at a third of the 1b pair's cost; the reporter's
1B model is test_lightning_18336.py's); thresholds are the issue's, never tuned. Lightning's FSDP and DeepSpeed strategies need CUDA, and Accelerate ignores its FSDP
and DeepSpeed plugins on CPU, so on CPU only the DDP pair runs; the rest skip with the reason.
"""

import pytest

pytestmark = [pytest.mark.distperf(world_size=2), pytest.mark.lightning]

# Same seed and batches: fp32 on CPU agrees to rounding. On CUDA two correct engines' bf16 curves lie within
# d_A + fp32 gap + d_B of each other (test_zero3.py's LOSS_RTOL, argued there from benchmarks/loss_noise.py); a
# front-end and the engine it drives differ by that much (Trainer vs Fabric on ZeRO-3, 350m, 1xH200: 0.0216 apart).
LOSS_RTOL = {"cpu": 1e-4, "cuda": 0.0585}  # test_zero3.py's

# (id, A = (strategy, options), B = (strategy, options), marks)
PAIRS = [
    ("trainer_vs_fabric-fsdp_offload", ("lightning_trainer", dict(engine="fsdp", offload=True)),
     ("lightning_fabric", dict(engine="fsdp", offload=True)), [pytest.mark.fsdp, pytest.mark.offload]),
    ("trainer_vs_fabric-fsdp", ("lightning_trainer", dict(engine="fsdp")),
     ("lightning_fabric", dict(engine="fsdp")), [pytest.mark.fsdp]),
    ("trainer_vs_fabric-deepspeed_stage3", ("lightning_trainer", dict(engine="deepspeed", stage=3)),
     ("lightning_fabric", dict(engine="deepspeed", stage=3)), [pytest.mark.deepspeed, pytest.mark.zero3]),
    ("trainer_vs_fabric-ddp", ("lightning_trainer", dict(engine="ddp")),
     ("lightning_fabric", dict(engine="ddp")), [pytest.mark.ddp]),
    ("fabric_vs_raw-fsdp", ("lightning_fabric", dict(engine="fsdp")), ("fsdp", {}), [pytest.mark.fsdp]),
    ("accelerate_vs_raw-fsdp", ("accelerate", dict(engine="fsdp")), ("fsdp", {}),
     [pytest.mark.accelerate, pytest.mark.fsdp]),
    ("accelerate_vs_raw-deepspeed_stage3", ("accelerate", dict(engine="deepspeed", stage=3)),
     ("deepspeed", dict(stage=3)), [pytest.mark.accelerate, pytest.mark.deepspeed, pytest.mark.zero3]),
]
PARAMS = [pytest.param(a, b, id=pair_id, marks=marks) for pair_id, a, b, marks in PAIRS]


SHAPE = {"cpu": "tiny", "cuda": "350m"}


def pair(distperf, a, b):
    job_a = distperf.job(a[0], options=a[1], shape=SHAPE)
    return distperf.compare(job_a, distperf.job(b[0], options=b[1], shape=SHAPE), shared=True)


@pytest.mark.parametrize("a, b", PARAMS)
def test_step_time_within_1_1x(distperf, a, b):
    pair(distperf, a, b).assert_step_time_within(1.1)


@pytest.mark.parametrize("a, b", PARAMS)
def test_trains_alike(distperf, a, b):
    pair(distperf, a, b).assert_losses_match(LOSS_RTOL[distperf.device])


# Lightning's own parity check (tests/parity_fabric in Lightning's repository): Fabric's DDP against torch's
# DistributedDataParallel on the same model trains alike and holds the same memory. On CPU host RSS growth read
# Fabric 31.3 MiB against DDP 112.2 MiB in issue #45's session, 116.8 vs 195.3 and 115.8 vs 201.3 MiB in two here,
# while both trained bit-identically (it counts what each rank imports and allocates once); the memory check decides
# on the training state there (figures/quantities.memory_metric): 31.24 MiB on both sides, to the byte, in every run.
FABRIC_VS_DDP = [pytest.param(("lightning_fabric", dict(engine="ddp")), ("ddp", {}), id="fabric_vs_raw-ddp",
                              marks=pytest.mark.ddp)]


@pytest.mark.parametrize("a, b", FABRIC_VS_DDP)
def test_parity_trains_alike(distperf, a, b):
    pair(distperf, a, b).assert_losses_match(LOSS_RTOL[distperf.device])


@pytest.mark.parametrize("a, b", FABRIC_VS_DDP)
def test_parity_memory_within_1_1x(distperf, a, b):
    pair(distperf, a, b).assert_memory_within(1.1)
