"""The one timer and the memory readings, used inside ranks.

Timed steps (`StepTimer.window`): on CUDA each step is bracketed by two events recorded on the current stream,
and the window synchronises once, at its end: a synchronisation around every step would drain the queue the
next step's launches overlap with, and add to what it times. A step's time runs from its start event to its end
event: the host's launch time when the GPU keeps up, the GPU's work when the host runs ahead. On CPU a step is
wall time. `StepTimer.sync` is the device synchronisation for what is timed whole (build, warm-up, breakdown).

Host memory peaks come from the kernel's high-water mark (VmHWM), which Linux lets a process reset
(`/proc/self/clear_refs`, value 5).
"""

from __future__ import annotations

import contextlib
import resource
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import torch

T = TypeVar("T")


class StepTimer:
    def __init__(self, device: torch.device):
        self.device = device

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def window(self, steps: int) -> "TimedWindow":
        """A window of timed steps (`steps`: how many to prepare marks for; more still work)."""
        if self.device.type == "cuda":
            return TimedWindow(CudaMarks(self.device, steps))
        return TimedWindow(HostMarks())


class HostMarks:
    """CPU: a mark is perf_counter(); the step's work is done when it returns."""

    def mark(self) -> float:
        return time.perf_counter()

    def wait(self) -> None:
        pass

    @staticmethod
    def seconds(start: float, end: float) -> float:
        return end - start


class CudaMarks:
    """CUDA: a mark is an event recorded on the device's current stream; wait() is the window's one
    synchronisation. Events are made up front, so a step records and allocates nothing else."""

    def __init__(self, device: torch.device, steps: int, new_event: Callable[[], Any] | None = None,
                 stream: Any = None):
        self.device = device
        self._new_event = new_event or (lambda: torch.cuda.Event(enable_timing=True))
        self._spare = [self._new_event() for _ in range(2 * steps)]
        # The stream the steps' work is queued on: the current one of this thread when the window opens
        # (the default stream; a front-end's loop on another thread queues there too).
        self._stream = stream if stream is not None else torch.cuda.current_stream(device)

    def mark(self) -> Any:
        event = self._spare.pop() if self._spare else self._new_event()
        event.record(self._stream)
        return event

    def wait(self) -> None:
        torch.cuda.synchronize(self.device)

    @staticmethod
    def seconds(start: Any, end: Any) -> float:
        return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds


class TimedWindow:
    """`time(fn)` for each step the harness calls, or `lap()` at each boundary of steps it does not call (a
    script's optimizer steps: a step runs from one lap to the next); then `finish()` for this rank's step times in
    seconds, in order."""

    def __init__(self, marks: Any):
        self._marks = marks
        self._pairs: list[tuple[Any, Any]] = []
        self._times: list[float] | None = None
        self._last_lap: Any = None

    def lap(self) -> None:
        if self._times is not None:
            raise RuntimeError("this timed window is finished; start a new one")
        mark = self._marks.mark()
        if self._last_lap is not None:
            self._pairs.append((self._last_lap, mark))
        self._last_lap = mark

    def time(self, fn: Callable[[], T]) -> T:
        if self._times is not None:
            raise RuntimeError("this timed window is finished; start a new one")
        start = self._marks.mark()
        out = fn()
        self._pairs.append((start, self._marks.mark()))
        return out

    def finish(self) -> list[float]:
        if self._times is None:
            self._marks.wait()
            self._times = [self._marks.seconds(start, end) for start, end in self._pairs]
        return list(self._times)


@dataclass
class WindowReadings:
    """What a metered window read: the step times, and the machine around them."""

    step_times: list[float]
    cpu_window: Any  # hostload.CpuWindow
    gpu_window: Any  # clocks.GpuWindow; None on CPU
    cuda_peaks: "CudaPeaks | None"
    host_peak_rss: int

    def result_fields(self) -> dict[str, Any]:
        """The RankResult fields these readings fill."""
        peaks = self.cuda_peaks
        return dict(step_times=self.step_times, cpu_window=self.cpu_window, gpu_window=self.gpu_window,
                    host_peak_rss=self.host_peak_rss, cuda_peak_allocated=peaks.allocated if peaks else None,
                    cuda_peak_reserved=peaks.reserved if peaks else None)


class MeteredWindow:
    """The timed window with what is read around it, for every kind of job: memory peaks reset at its start and
    read at its end, the rank's CPU use (hostload.py: is the machine busy with other work while we time?) and the
    GPU's clocks (clocks.py). The meters start after the window's events are made, outside every step."""

    def __init__(self, device: torch.device, steps: int):
        from pytest_distperf.rank.clocks import ClockSampler
        from pytest_distperf.rank.hostload import CpuMeter

        self.device = device
        reset_cuda_peaks(device)
        reset_host_peak()
        self.window = StepTimer(device).window(steps)
        self._cpu, self._clocks = CpuMeter(), ClockSampler.for_device(device)
        self._cpu.start()
        if self._clocks:
            self._clocks.start()
        self.lap, self.time = self.window.lap, self.window.time

    def finish(self) -> WindowReadings:
        step_times = self.window.finish()  # on CUDA the window's one synchronisation
        gpu_window = self._clocks.stop() if self._clocks else None
        return WindowReadings(step_times=step_times, cpu_window=self._cpu.stop(), gpu_window=gpu_window,
                              cuda_peaks=read_cuda_peaks(self.device), host_peak_rss=host_peak_rss())

    def abandon(self) -> None:
        """Stop the meters without a reading (a window that will not be finished)."""
        self._cpu.stop()
        if self._clocks:
            self._clocks.stop()


def _status_kib(field: str) -> int | None:
    with contextlib.suppress(OSError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
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
