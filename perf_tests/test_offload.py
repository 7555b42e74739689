"""ZeRO-3 with optimizer (and parameter) offload: does the optimizer really run on the CPU?

Seed case: a ZeRO-Infinity user (`offload_optimizer` and `offload_param` to nvme) saw GPU
kernels and many host/device copies in backward where the optimizer should run on the CPU,
and the CPU nearly idle. The placement probe measures, over a few profiled steps after the
timing phase: time inside DeepSpeedCPUAdam.step(), kernels launched from inside any
optimizer step, where the optimizer state lives, host/device copies (bytes, pageable or
pinned). NVMe cases write to the job's scratch folder and skip where DeepSpeed's async I/O
(libaio) is unavailable. Each case runs once per session; its tests share the run.

Shapes: `tiny` on CPU; `350m` on CUDA, so the NVMe cases move a few GB of swap per rank
and step rather than tens (the question here is where the work runs, not how fast).
"""

import math

import pytest

pytestmark = [pytest.mark.distperf(world_size=2), pytest.mark.zero3, pytest.mark.offload, pytest.mark.deepspeed]

SHAPE = {"cpu": "tiny", "cuda": "350m"}
D2H_LIMIT = 1.1  # gradient device-to-host bytes per step at most 1.1x this rank's gradient partition
FP32 = 4  # the offloaded gradient partition is fp32 (ds_config: communication_data_type fp32)
CASES = {
    "optimizer-cpu": {"offload_optimizer": "cpu"},
    "optimizer-nvme": {"offload_optimizer": "nvme"},
    "optimizer-nvme+param-nvme": {"offload_optimizer": "nvme", "offload_param": "nvme"},
}


@pytest.fixture(params=list(CASES))
def offloaded(request, distperf):
    job = distperf.job("deepspeed", stage=3, shape=SHAPE, steps=3, probes=("comms", "placement"),
                       **CASES[request.param])
    return distperf.probe(job)


def test_optimizer_step_runs_in_deepspeed_cpu_adam(distperf, offloaded):
    distperf.probe_checks(offloaded).assert_optimizer_cpu_time("DeepSpeedCPUAdam")


def test_no_gpu_kernels_inside_optimizer_step(distperf, offloaded):
    distperf.probe_checks(offloaded).assert_no_optimizer_gpu_kernels()


def test_optimizer_state_on_cpu(distperf, offloaded):
    distperf.probe_checks(offloaded).assert_optimizer_state_on("cpu")


def test_gradient_d2h_close_to_local_partition(distperf, offloaded):
    world = offloaded.spec.world_size
    partition = math.ceil(offloaded.ranks[0].num_params / world) * FP32
    distperf.probe_checks(offloaded).assert_copy_bytes_within("DtoH", partition, D2H_LIMIT)


def test_no_pageable_copies(distperf, offloaded):
    distperf.probe_checks(offloaded).assert_no_pageable_copies()
