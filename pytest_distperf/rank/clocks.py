"""What a rank's GPU did while its steps were timed: SM and memory clocks, clock-event (throttle) reasons,
power and temperature, read through NVML.

The rank samples when the window opens, every `INTERVAL_S` from a background thread (NVML calls release the
GIL), and when it closes. Only the summary, `GpuWindow`, crosses back to the pytest process, which warns when a
window was throttled or the clocks were not locked (`clock_warning`, `ClockWarnings`). Locked clocks still slow
down at the power or thermal limit, so the reasons are always read. No torch or pynvml at import.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

INTERVAL_S = 0.1  # a sample takes the GIL a few times between its NVML calls: ten a second keep that rare

# NVML's clock-event reason bits (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*).
REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",  # also locked clocks holding the GPU below its boost clock
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
    0x200: "board_limit",
    0x400: "reliability",
}
# Reasons that do not slow a busy GPU down against its own setting: idle between launches, or the
# clocks held where the applications-clocks / locked-clocks setting puts them.
NOT_THROTTLING = frozenset({"gpu_idle", "applications_clocks_setting"})


def decode_reasons(mask: int) -> list[str]:
    """Names of the reason bits set in an NVML clock-event mask; unknown bits as hex."""
    names = [name for bit, name in REASONS.items() if mask & bit]
    unknown = mask & ~sum(REASONS)
    if unknown:
        names.append(f"unknown_{unknown:#x}")
    return names


def throttling(names: list[str] | set[str] | dict[str, Any]) -> list[str]:
    """The reasons among `names` that count as throttling (all but idle and the clocks setting)."""
    return sorted(n for n in names if n not in NOT_THROTTLING)


@dataclass
class ClockSample:
    """One NVML reading; None where the GPU does not report that quantity."""

    t: float  # seconds since the window opened
    sm_mhz: int | None = None
    mem_mhz: int | None = None
    reasons: int | None = None  # NVML clock-event reason mask
    power_w: float | None = None
    temp_c: int | None = None


@dataclass
class GpuWindow:
    """A rank's GPU over its timed steps (crosses the rank -> pytest boundary). `unread` says why nothing
    was read (no nvidia-ml-py, no NVML device for the rank's GPU); the readings are then empty."""

    gpu: str = ""  # NVML name
    uuid: str = ""
    seconds: float = 0.0
    samples: int = 0
    sm_mhz_min: int | None = None
    sm_mhz_median: float | None = None
    sm_mhz_max: int | None = None
    mem_mhz_min: int | None = None
    mem_mhz_max: int | None = None
    power_w_mean: float | None = None
    power_w_max: float | None = None
    power_limit_w: float | None = None
    temp_c_start: int | None = None
    temp_c_max: int | None = None
    reasons: dict[str, int] = field(default_factory=dict)  # reason -> samples it was active in
    throttled_samples: int = 0  # samples with a throttling reason (see NOT_THROTTLING)
    unread: str | None = None

    @property
    def throttle_reasons(self) -> list[str]:
        return throttling(self.reasons)

    @property
    def clock_moved(self) -> bool:
        """The SM clock was not one value over the window."""
        return self.sm_mhz_min is not None and self.sm_mhz_min != self.sm_mhz_max

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {**asdict(self), "throttle_reasons": self.throttle_reasons}


def summarise(samples: list[ClockSample], *, gpu: str = "", uuid: str = "", seconds: float = 0.0,
              power_limit_w: float | None = None) -> GpuWindow:
    """The window's summary over its samples."""

    def values(name: str) -> list[Any]:
        return [v for s in samples if (v := getattr(s, name)) is not None]

    sm, mem, power, temp = values("sm_mhz"), values("mem_mhz"), values("power_w"), values("temp_c")
    reasons: dict[str, int] = {}
    throttled = 0
    for s in samples:
        if s.reasons is None:
            continue
        names = decode_reasons(s.reasons)
        for n in names:
            reasons[n] = reasons.get(n, 0) + 1
        throttled += bool(throttling(names))
    return GpuWindow(
        gpu=gpu, uuid=uuid, seconds=seconds, samples=len(samples),
        sm_mhz_min=min(sm) if sm else None, sm_mhz_median=statistics.median(sm) if sm else None,
        sm_mhz_max=max(sm) if sm else None, mem_mhz_min=min(mem) if mem else None,
        mem_mhz_max=max(mem) if mem else None,
        power_w_mean=round(statistics.fmean(power), 1) if power else None,
        power_w_max=round(max(power), 1) if power else None, power_limit_w=power_limit_w,
        temp_c_start=temp[0] if temp else None, temp_c_max=max(temp) if temp else None,
        reasons=reasons, throttled_samples=throttled)


# -- the pytest process: what to warn about ---------------------------------------------------------------------
def window_problems(w: GpuWindow, locked: bool) -> list[str]:
    """What makes this window's step times less comparable: throttling, or clocks that were not locked
    (`locked`: True where they were, or where that is not to be reported)."""
    if w.unread:
        return [f"GPU clocks not read ({w.unread})"]
    out = []
    reasons = w.throttle_reasons
    if reasons:
        share = f"{w.throttled_samples} of {w.samples} samples"
        out.append(f"throttled ({', '.join(reasons)} in {share})")
    if not locked:
        sm = (f"; SM clock {w.sm_mhz_min}-{w.sm_mhz_max} MHz" if w.clock_moved
              else f"; SM clock {w.sm_mhz_min} MHz" if w.sm_mhz_min is not None else "")
        out.append(f"clocks not locked{sm}")
    return out


def clock_warning(label: str, windows: list["GpuWindow | None"], locked_uuids: set[str] | None,
                  report_unlocked: bool = True) -> str | None:
    """One warning text for a run's ranks (in rank order), or None. `locked_uuids`: the GPUs whose clocks
    distperf locked (None: locked outside distperf); `report_unlocked`: False once a test was told."""
    parts = []
    for rank, w in enumerate(windows):
        if w is None:
            continue
        locked = not report_unlocked or locked_uuids is None or w.uuid in locked_uuids
        problems = window_problems(w, locked)
        if problems:
            parts.append(f"rank {rank} ({w.gpu or 'GPU'}): {'; '.join(problems)}")
    if not parts:
        return None
    unlocked = any("clocks not locked" in p for p in parts)
    return (f"{label}: GPU clocks in the timed steps: " + " | ".join(parts)
            + (" (lock them with --distperf-lock-gpu-clocks, or say --distperf-lock-gpu-clocks=external where "
               "they are locked outside pytest)" if unlocked else ""))


class ClockWarnings:
    """One test's GPU clock warnings: throttling in any run, and clocks that were not locked once per test."""

    def __init__(self, setting: str | int | None, folder: str | None = None):
        self.setting = setting
        self.folder = folder
        self.told_unlocked = False

    def check(self, label: str, ranks: list[Any]) -> str | None:
        from pytest_distperf.launch.allocator import lock_dir
        from pytest_distperf.launch.gpuclocks import locked_uuids
        from pytest_distperf.spec.settings import CLOCKS_EXTERNAL

        windows = [getattr(r, "gpu_window", None) for r in ranks]
        if not any(windows):
            return None
        locked = None if self.setting == CLOCKS_EXTERNAL else locked_uuids(self.folder or lock_dir())
        text = clock_warning(label, windows, locked, report_unlocked=not self.told_unlocked)
        if text and "clocks not locked" in text:
            self.told_unlocked = True
        return text


# -- inside the rank: reading NVML ------------------------------------------------------------------------------
def _nvml_handle(nvml: Any, device: Any) -> tuple[Any, str]:
    """The NVML handle and UUID of the torch CUDA device `device`: by the UUID CUDA reports for it (indices
    in CUDA_VISIBLE_DEVICES follow CUDA's device order, which need not be NVML's), else by its PCI bus id,
    else by a UUID given in CUDA_VISIBLE_DEVICES. A MIG instance reads its parent GPU."""
    import torch

    props = torch.cuda.get_device_properties(device)
    candidates = []
    uuid = str(getattr(props, "uuid", "") or "")
    if uuid:
        candidates += [("uuid", f"GPU-{uuid}"), ("uuid", f"MIG-{uuid}")]
    bus = getattr(props, "pci_bus_id", None)
    if bus is not None:
        candidates.append(("pci", f"{getattr(props, 'pci_domain_id', 0):08X}:{bus:02X}:"
                                  f"{getattr(props, 'pci_device_id', 0):02X}.0"))
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index < len(visible) and visible[index].startswith(("GPU-", "MIG-")):
        candidates.append(("uuid", visible[index]))
    for kind, key in candidates:
        try:
            handle = (nvml.nvmlDeviceGetHandleByUUID(key) if kind == "uuid"
                      else nvml.nvmlDeviceGetHandleByPciBusId(key))
        except nvml.NVMLError:
            continue
        with contextlib.suppress(nvml.NVMLError, AttributeError):
            is_mig = nvml.nvmlDeviceIsMigDeviceHandle(handle)  # a ctypes c_uint in pynvml
            if int(getattr(is_mig, "value", is_mig)):
                handle = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
        return handle, _text(nvml.nvmlDeviceGetUUID(handle))
    raise LookupError(f"no NVML device matches {device} (tried {', '.join(k for _, k in candidates) or 'nothing'})")


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _maybe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception:  # NVMLError_NotSupported and the like: that quantity is not reported here
        return None


class ClockSampler:
    """start() when the timed window opens, stop() after its synchronisation -> GpuWindow (one window per
    sampler: stop() also lets go of NVML).

    `for_device` returns None on CPU. Where NVML cannot be read, stop() returns a GpuWindow saying why."""

    def __init__(self, nvml: Any = None, handle: Any = None, gpu: str = "", uuid: str = "",
                 unread: str | None = None, interval_s: float = INTERVAL_S):
        self._nvml, self._handle, self.gpu, self.uuid, self.unread = nvml, handle, gpu, uuid, unread
        self.interval_s = interval_s
        self._samples: list[ClockSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self.power_limit_w: float | None = None
        if nvml is not None:
            self._read_reasons = self._reasons_reader(nvml, handle)
            temperature = getattr(nvml, "NVML_TEMPERATURE_GPU", 0)
            self._read_temp = lambda: nvml.nvmlDeviceGetTemperature(handle, temperature)
            self.power_limit_w = _maybe(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)

    @staticmethod
    def _reasons_reader(nvml: Any, handle: Any) -> Callable[[], int]:
        """The clock-event reasons call: its current name where pynvml and the driver have it, else the older
        (throttle) name of the same call."""
        newer = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
        if newer is not None:
            with contextlib.suppress(Exception):  # NVMLError_FunctionNotFound on an older driver
                newer(handle)
                return lambda: newer(handle)
        return lambda: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)

    @classmethod
    def for_device(cls, device: Any) -> "ClockSampler | None":
        if getattr(device, "type", None) != "cuda":
            return None
        try:
            import pynvml
        except ImportError:
            return cls(unread="nvidia-ml-py is not installed in the ranks' environment: pip install nvidia-ml-py")
        try:
            pynvml.nvmlInit()
        except Exception as e:  # NVMLError: no driver library, or it refused
            return cls(unread=f"NVML: {e}")
        try:
            handle, uuid = _nvml_handle(pynvml, device)
            name = _text(pynvml.nvmlDeviceGetName(handle))
        except (LookupError, pynvml.NVMLError) as e:
            pynvml.nvmlShutdown()
            return cls(unread=str(e))
        return cls(pynvml, handle, name, uuid)

    def _sample(self) -> ClockSample:
        nvml, h = self._nvml, self._handle
        power_mw = _maybe(lambda: nvml.nvmlDeviceGetPowerUsage(h))
        return ClockSample(
            t=time.perf_counter() - self._t0,
            sm_mhz=_maybe(lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            mem_mhz=_maybe(lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)),
            reasons=_maybe(self._read_reasons), power_w=power_mw / 1000.0 if power_mw is not None else None,
            temp_c=_maybe(self._read_temp))

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._samples.append(self._sample())

    def start(self) -> None:
        self._t0 = time.perf_counter()
        if self._nvml is None:
            return
        self._samples = [self._sample()]
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="distperf-gpu-clocks", daemon=True)
        self._thread.start()

    def stop(self) -> GpuWindow:
        seconds = time.perf_counter() - self._t0
        if self._nvml is None:
            return GpuWindow(unread=self.unread, seconds=seconds)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._samples.append(self._sample())
        _maybe(self._nvml.nvmlShutdown)
        self._nvml = None
        return summarise(self._samples, gpu=self.gpu, uuid=self.uuid, seconds=seconds,
                         power_limit_w=self.power_limit_w)
