"""A CPU job never touches a GPU: its ranks see none, every library picks its CPU path, CUDA use fails.

On a CPU-only machine the environment the ranks get is checked; on a machine with a GPU (one is
enough) the GPU tests prove that `--distperf-device=cpu` jobs of every strategy family create no CUDA
context (NVML's process lists, read from outside the ranks) and that CUDA use in a CPU job fails.
"""

from __future__ import annotations

import os
import threading
import time

import psutil
import pytest

from pytest_distperf.launch.devices import CPU_ONLY_ENVIRONMENT, nvml
from pytest_distperf.launch.launcher import RankFailed, agent_environment, launch
from pytest_distperf.spec.job import FunctionRef, JobSpec

needs_gpu = pytest.mark.gpu(reason="proves that a CPU job creates no CUDA context next to one")


def rank_view() -> dict:
    """In every rank of a CPU job: what it sees of the GPUs and which accelerator each library would pick."""
    import torch

    return {"env": {k: os.environ.get(k) for k in CPU_ONLY_ENVIRONMENT}, "cuda_available": torch.cuda.is_available(),
            "cuda_devices": torch.cuda.device_count()}


def library_choices() -> dict:
    """DeepSpeed's, Lightning Fabric's and Trainer's and Accelerate's own device choice, in a CPU job's rank."""
    import torch
    from deepspeed.accelerator import get_accelerator
    from lightning.fabric import Fabric
    from lightning.pytorch import Trainer
    from accelerate import Accelerator

    ranks = int(os.environ["LOCAL_WORLD_SIZE"])  # torch elastic's world: Lightning checks devices x nodes against it
    trainer = Trainer(devices=ranks, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    return {"deepspeed": get_accelerator().device_name(), "fabric": Fabric(devices=ranks).device.type,
            "trainer": type(trainer.accelerator).__name__, "accelerate": Accelerator().device.type,
            "cuda_initialized": torch.cuda.is_initialized()}


def use_cuda() -> None:
    import torch

    torch.ones(1, device="cuda")


def reach_for_a_gpu() -> None:
    """A library that puts a GPU back in the environment before CUDA starts: the worker's guard must catch it."""
    import torch

    os.environ["CUDA_VISIBLE_DEVICES"] = "0"
    torch.cuda.init()


def _job(fn, device: str = "cpu") -> JobSpec:
    return JobSpec(world_size=2, device=device, function=FunctionRef(__name__, fn.__name__, __file__),
                   sys_path=[os.path.dirname(__file__)])


def test_a_cpu_jobs_ranks_get_no_gpu_in_their_environment(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    env = agent_environment(_job(rank_view))
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert env["DS_ACCELERATOR"] == "cpu"
    assert env["ACCELERATE_USE_CPU"] == "true"
    assert env["LT_ACCELERATOR"] == "cpu"
    assert env["PL_TRAINER_ACCELERATOR"] == "cpu"


def test_a_cuda_job_keeps_the_gpus_it_was_given():
    env = agent_environment(_job(rank_view, device="cuda"), {"CUDA_VISIBLE_DEVICES": "1"})
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "DS_ACCELERATOR" not in env or env["DS_ACCELERATOR"] != "cpu"


@pytest.mark.slow
def test_the_ranks_of_a_cpu_job_see_no_gpu(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # as on a GPU machine: the job must hide it
    values = launch(_job(rank_view), timeout=300, base_dir=str(tmp_path))
    for rank, seen in values.items():
        assert seen["env"] == CPU_ONLY_ENVIRONMENT, rank
        assert seen["cuda_available"] is False and seen["cuda_devices"] == 0, rank


# -- on a machine with a GPU -----------------------------------------------------------------------------------
class _CudaContexts:
    """Samples NVML's compute and graphics process lists of every GPU while a block runs: the pids of this
    process's descendants (the agent and the ranks) that held a CUDA context, and how many descendants it saw."""

    def __init__(self) -> None:
        self.offenders: dict[int, str] = {}
        self.descendants_seen = 0
        self._stop = threading.Event()

    def __enter__(self) -> "_CudaContexts":
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        with nvml() as lib:
            assert lib is not None
            handles = [lib.nvmlDeviceGetHandleByIndex(i) for i in range(lib.nvmlDeviceGetCount())]
            while not self._stop.is_set():
                tree = {p.pid: p for p in psutil.Process().children(recursive=True)}
                self.descendants_seen = max(self.descendants_seen, len(tree))
                for h in handles:
                    for info in (lib.nvmlDeviceGetComputeRunningProcesses(h)
                                 + lib.nvmlDeviceGetGraphicsRunningProcesses(h)):
                        if info.pid in tree:
                            try:
                                self.offenders[info.pid] = " ".join(tree[info.pid].cmdline())[:200]
                            except psutil.Error:
                                self.offenders[info.pid] = "?"
                time.sleep(0.05)


CPU_SUITE = """
import pytest
import test_cpu_jobs

@pytest.mark.distperf(world_size=2)
@pytest.mark.parametrize("strategy,options", [
    ("deepspeed", {"stage": 3}), ("fsdp2", {}), ("ddp", {}), ("lightning_fabric", {}), ("lightning_trainer", {}),
    ("accelerate", {}),
])
def test_strategy_on_cpu(distperf, strategy, options):
    assert distperf.device == "cpu"
    distperf.run(strategy, steps=2, warmup=1, options=options)

@pytest.mark.distperf(world_size=2)
def test_library_choices(distperf):
    for seen in distperf.run_function(test_cpu_jobs.library_choices):
        assert seen == {"deepspeed": "cpu", "fabric": "cpu", "trainer": "CPUAccelerator", "accelerate": "cpu",
                        "cuda_initialized": False}, seen
"""


@needs_gpu
def test_cpu_jobs_of_every_strategy_create_no_cuda_context_on_a_gpu_machine(pytester, monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    pytester.makepyfile(test_cpu_suite=CPU_SUITE)
    with _CudaContexts() as contexts:
        result = pytester.runpytest("--distperf", "--distperf-device=cpu", "-p", "no:cacheprovider", "-rfEsx")
    result.assert_outcomes(passed=7)
    assert contexts.descendants_seen >= 3, "the sampler never saw the ranks"
    assert not contexts.offenders, f"CPU-job processes with a CUDA context: {contexts.offenders}"


@needs_gpu
def test_cuda_use_in_a_cpu_job_fails_loudly(tmp_path):
    # A forked CPU rank cannot start CUDA at all (torch refuses it after fork); the worker says why in its words.
    with pytest.raises(RankFailed, match="No CUDA GPUs are available|no CUDA-capable device|this CPU job used CUDA"):
        launch(_job(use_cuda), timeout=300, base_dir=str(tmp_path))
    with pytest.raises(RankFailed, match="CPU job initialised CUDA|this CPU job used CUDA"):
        launch(_job(reach_for_a_gpu), timeout=300, base_dir=str(tmp_path))
