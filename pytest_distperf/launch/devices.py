"""Which device a test runs on, decided in the pytest process without initialising CUDA."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from typing import Any, Iterator

# torch.cuda.is_available() through NVML: no cuInit, so a process stays fork-safe for CUDA ranks.
NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"

# What a CPU job's ranks get: no GPU, and every library told so (else each picks CUDA by itself where there is a
# GPU, and a comparison could run one side on the GPUs). Any CUDA use in such a rank then fails in torch itself.
CPU_ONLY_ENVIRONMENT = {
    "CUDA_VISIBLE_DEVICES": "",  # torch, NCCL, and everything built on them: no device
    "DS_ACCELERATOR": "cpu",  # DeepSpeed's accelerator, else detected from torch.cuda
    "ACCELERATE_USE_CPU": "true",  # Accelerate's AcceleratorState (cpu=True)
    "LT_ACCELERATOR": "cpu",  # Lightning Fabric's connector: overrides Fabric(accelerator=...)
    "PL_TRAINER_ACCELERATOR": "cpu",  # Lightning Trainer's default accelerator ("auto" would look for a GPU)
}


def usable_cores() -> int:
    """Cores this process may run on (affinity, e.g. a container's cpuset), not the host's total."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def visible_gpu_ids(total: int | None = None) -> list[str]:
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (indices or UUIDs), in order; like CUDA,
    the list ends at the first entry that cannot name a device. `total`: the machine's GPU count (default: read)."""
    total = physical_gpu_count() if total is None else total
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [str(i) for i in range(total)]
    ids: list[str] = []
    for entry in (v.strip() for v in visible.split(",")):
        if not entry or entry.startswith("-"):
            break
        ids.append(entry)
    return ids[:total]


def visible_gpu_count() -> int:
    """GPUs this process may use: the machine's count, narrowed by CUDA_VISIBLE_DEVICES. No CUDA context."""
    return len(visible_gpu_ids())


def nvml_indices(ids: list[str], total: int) -> list[int]:
    """NVML device indices of visible GPU ids (indices past `total` dropped); UUID/MIG names map to the
    first ones (same model assumed)."""
    if all(v.isdigit() for v in ids):
        return [int(v) for v in ids if int(v) < total]
    return list(range(min(len(ids), total)))


@contextlib.contextmanager
def nvml() -> Iterator[Any]:
    """The pynvml module, initialised for the block; None where pynvml or the driver is missing."""
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError: no driver on this machine
        yield None
        return
    try:
        yield pynvml
    finally:
        pynvml.nvmlShutdown()


def nvml_text(value: Any) -> str:
    """A string NVML returned (bytes from older pynvml)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def nvidia_smi(*args: str) -> list[str]:
    """Non-empty output lines of `nvidia-smi ARGS`; [] where it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def physical_gpu_count() -> int:
    """GPUs on this machine, from NVML, else from `nvidia-smi -L`; 0 without a driver."""
    with nvml() as lib:
        if lib is not None:
            return int(lib.nvmlDeviceGetCount())
    return sum(1 for line in nvidia_smi("-L") if line.startswith("GPU "))
