"""Which device a test runs on, decided in the pytest process without initialising CUDA."""

from __future__ import annotations

import os
import shutil
import subprocess

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def visible_gpu_count() -> int:
    """GPUs this process may use: NVML's count, narrowed by CUDA_VISIBLE_DEVICES. No CUDA context."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    total = _nvml_count()
    if total is None:
        total = _nvidia_smi_count()
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() and not v.strip().startswith("-")]
        return min(len(ids), total)
    return total


def _nvml_count() -> int | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # NVMLError: no driver on this machine
        return 0


def _nvidia_smi_count() -> int:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def resolve_device(option: str, marker: str | None, world_size: int, gpus: int) -> tuple[str | None, str | None]:
    """Return (device, None) or (None, skip reason).

    option: --distperf-device (auto|cpu|cuda); marker: the test's own device= (None/auto: follow the option;
    cpu: always CPU; cuda: the test needs GPUs).
    """
    if marker in (None, "auto"):
        if option == "cpu":
            return "cpu", None
        if option == "auto":
            return ("cuda", None) if gpus >= world_size > 0 and gpus > 0 else ("cpu", None)
        return ("cuda", None) if gpus >= world_size else (None, _too_few(world_size, gpus))
    if marker == "cpu":
        return "cpu", None
    if option == "cpu":
        return None, "this test needs CUDA, and --distperf-device=cpu was given"
    return ("cuda", None) if gpus >= world_size else (None, _too_few(world_size, gpus))


def _too_few(world_size: int, gpus: int) -> str:
    return f"needs {world_size} GPU{'s' if world_size != 1 else ''} (world_size={world_size}); this machine has {gpus}"
