"""The one timer and the memory readings, used inside ranks.

Each step is bracketed by a device synchronisation so the wall time covers the GPU
work the step queued. Host memory peaks come from the kernel's high-water mark
(VmHWM), which Linux lets a process reset (`/proc/self/clear_refs`, value 5).
"""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from typing import Callable, TypeVar

import torch

T = TypeVar("T")


class StepTimer:
    def __init__(self, device: torch.device):
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def time(self, fn: Callable[[], T]) -> tuple[T, float]:
        self.sync()
        start = time.perf_counter()
        out = fn()
        self.sync()
        return out, time.perf_counter() - start


def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def host_rss() -> int:
    kib = _status_kib("VmRSS")
    return kib * 1024 if kib is not None else 0


def reset_host_peak() -> bool:
    """Reset VmHWM to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def host_peak_rss() -> int:
    kib = _status_kib("VmHWM")
    if kib is None:  # not Linux: lifetime peak (KiB on Linux, bytes on macOS)
        kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib * 1024


@dataclass
class CudaPeaks:
    allocated: int
    reserved: int


def reset_cuda_peaks(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def read_cuda_peaks(device: torch.device) -> CudaPeaks | None:
    if device.type != "cuda":
        return None
    return CudaPeaks(torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device))
