"""GPU clocks over a timed window (rank/clocks.py): the pure parts -- reason decoding, the window summary,
what is warned about. The NVML reading itself runs on a GPU (the verification commands in the issue note)."""

from __future__ import annotations

from importlib.metadata import entry_points
import json
import threading
import time

import pytest
import torch

from pytest_distperf.rank import clocks
from pytest_distperf.rank.clocks import (ClockSample, ClockSampler, ClockWarnings, GpuWindow, clock_warning,
                                        decode_reasons, summarise)


def test_reason_bits_decode_by_name_and_unknown_bits_stay_visible():
    assert decode_reasons(0) == []
    assert decode_reasons(0x1 | 0x4) == ["gpu_idle", "sw_power_cap"]
    assert decode_reasons(0x40 | 0x8000) == ["hw_thermal_slowdown", "unknown_0x8000"]


def test_idle_and_the_clocks_setting_are_not_throttling():
    assert clocks.throttling(decode_reasons(0x1 | 0x2)) == []
    assert clocks.throttling(decode_reasons(0x2 | 0x4 | 0x20)) == ["sw_power_cap", "sw_thermal_slowdown"]
    assert clocks.throttling(decode_reasons(0x10)) == ["sync_boost"]


def test_a_window_summarises_its_samples():
    samples = [ClockSample(t=0.0, sm_mhz=1980, mem_mhz=3201, reasons=0x0, power_w=350.0, temp_c=40),
               ClockSample(t=0.05, sm_mhz=1755, mem_mhz=3201, reasons=0x4, power_w=700.0, temp_c=45),
               ClockSample(t=0.10, sm_mhz=1830, mem_mhz=3201, reasons=0x4 | 0x2, power_w=650.0, temp_c=47),
               ClockSample(t=0.15, sm_mhz=None, mem_mhz=None, reasons=None, power_w=None, temp_c=None)]
    w = summarise(samples, gpu="NVIDIA H200", uuid="GPU-1", seconds=0.15, power_limit_w=700.0)
    assert (w.samples, w.sm_mhz_min, w.sm_mhz_median, w.sm_mhz_max) == (4, 1755, 1830, 1980)
    assert (w.mem_mhz_min, w.mem_mhz_max) == (3201, 3201)
    assert (w.power_w_mean, w.power_w_max, w.power_limit_w) == (566.7, 700.0, 700.0)
    assert (w.temp_c_start, w.temp_c_max) == (40, 47)
    assert w.reasons == {"sw_power_cap": 2, "applications_clocks_setting": 1}
    assert w.throttled_samples == 2 and w.throttle_reasons == ["sw_power_cap"] and w.clock_moved
    d = w.to_json()
    assert d["throttle_reasons"] == ["sw_power_cap"] and d["reasons"] == w.reasons and d["unread"] is None


def _window(**kw) -> GpuWindow:
    base = dict(gpu="NVIDIA H200", uuid="GPU-a", seconds=2.0, samples=40, sm_mhz_min=1980, sm_mhz_median=1980,
                sm_mhz_max=1980, reasons={}, throttled_samples=0)
    return GpuWindow(**{**base, **kw})


def test_a_quiet_window_on_locked_clocks_says_nothing():
    assert clock_warning("ddp 1b x1 cuda", [_window()], locked_uuids={"GPU-a"}) is None
    assert clock_warning("ddp 1b x1 cuda", [None], locked_uuids=set()) is None  # a CPU rank: nothing read


def test_throttling_is_reported_even_on_locked_clocks():
    w = _window(reasons={"sw_power_cap": 12, "gpu_idle": 3}, throttled_samples=12, sm_mhz_min=1650)
    text = clock_warning("fsdp2 1b x2 cuda", [_window(uuid="GPU-b"), w], locked_uuids={"GPU-a", "GPU-b"})
    assert text == ("fsdp2 1b x2 cuda: GPU clocks in the timed steps: rank 1 (NVIDIA H200): throttled "
                    "(sw_power_cap in 12 of 40 samples)")


def test_clocks_that_were_not_locked_are_reported_with_their_range_and_the_fix():
    w = _window(sm_mhz_min=1755)
    text = clock_warning("ddp 350m x1 cuda", [w], locked_uuids=set())
    assert "rank 0 (NVIDIA H200): clocks not locked; SM clock 1755-1980 MHz" in text
    assert "--distperf-lock-gpu-clocks" in text and "=external" in text
    assert clock_warning("ddp 350m x1 cuda", [w], locked_uuids=None) is None  # locked outside pytest
    assert clock_warning("ddp 350m x1 cuda", [w], locked_uuids=set(), report_unlocked=False) is None



def test_a_test_is_told_once_that_its_clocks_were_not_locked_and_of_every_throttled_run(tmp_path):
    class Rank:
        def __init__(self, w):
            self.gpu_window = w

    warnings = ClockWarnings(None, folder=str(tmp_path))  # no state file: distperf locked nothing
    assert "clocks not locked" in warnings.check("ddp 1b x1 cuda", [Rank(_window())])
    assert warnings.check("ddp 1b x1 cuda", [Rank(_window())]) is None  # told once per test
    throttled = _window(reasons={"hw_slowdown": 4}, throttled_samples=4)
    assert "throttled (hw_slowdown in 4 of 40 samples)" in warnings.check("ddp 1b x1 cuda", [Rank(throttled)])
    assert warnings.check("ddp 1b x1 cpu", [Rank(None)]) is None  # a CPU job: nothing read
    assert ClockWarnings("external", folder=str(tmp_path)).check("ddp 1b x1 cuda", [Rank(_window())]) is None

def test_a_window_that_could_not_be_read_says_why():
    w = GpuWindow(unread="nvidia-ml-py is not installed in the ranks' environment: pip install nvidia-ml-py")
    assert "GPU clocks not read (nvidia-ml-py is not installed" in clock_warning("job", [w], locked_uuids=None)


def test_cpu_ranks_read_no_gpu():
    assert ClockSampler.for_device(torch.device("cpu")) is None


class _Nvml:
    """Stands in for pynvml's few calls, to check the sampler's start/stop bookkeeping only."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0
    NVMLError = RuntimeError

    def __init__(self) -> None:
        self.shutdowns = 0

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980 if kind == 1 else 3201

    def nvmlDeviceGetCurrentClocksEventReasons(self, h):
        return 0x4

    def nvmlDeviceGetPowerUsage(self, h):
        return 650_000

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 50

    def nvmlDeviceGetEnforcedPowerLimit(self, h):
        raise self.NVMLError("Not Supported")

    def nvmlShutdown(self):
        self.shutdowns += 1


def test_the_sampler_reads_at_both_ends_and_in_between_then_lets_go_of_nvml():
    nvml = _Nvml()
    sampler = ClockSampler(nvml, handle=object(), gpu="NVIDIA H200", uuid="GPU-a", interval_s=0.01)
    sampler.start()
    time.sleep(0.1)
    w = sampler.stop()
    assert w.samples >= 4 and w.uuid == "GPU-a" and w.power_limit_w is None and w.power_w_max == 650.0
    assert w.reasons == {"sw_power_cap": w.samples} and nvml.shutdowns == 1
    assert not [t for t in threading.enumerate() if t.name == "distperf-gpu-clocks"]


# Where the package is on the path but not installed (no pytest11 entry point), the inner runs load it by name.
PLUGIN = ([] if any(ep.name == "distperf" for ep in entry_points(group="pytest11"))
          else ["-p", "pytest_distperf.plugin"])
@pytest.mark.gpu(nvml=True, reason="reads a real CUDA job's GPU clocks through NVML")
def test_a_cuda_jobs_json_report_has_each_ranks_gpu_window(pytester):
    """A real CUDA job (1 rank, ddp small): its rank read its GPU over the timed steps, the report has the window,
    and the pytest process itself created no CUDA context."""
    pytester.makepyfile("""
        import pytest

        @pytest.mark.distperf(world_size=1, device="cuda")
        def test_job(distperf):
            distperf.run("ddp", shape="small", steps=20)
    """)
    result = pytester.runpytest(*PLUGIN, "--distperf", "-p", "no:cacheprovider", "--distperf-json", "report.json", "-W",
                                "always::pytest_distperf.errors.GpuClockWarning", "-rw")
    result.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "report.json").read_text())
    window = doc["tests"][0]["jobs"][0]["runs"][0]["ranks"][0]["gpu_window"]
    assert window["unread"] is None, window
    assert window["uuid"].startswith(("GPU-", "MIG-")) and window["gpu"]
    assert window["samples"] >= 2 and window["seconds"] > 0
    assert 0 < window["sm_mhz_min"] <= window["sm_mhz_max"] and window["mem_mhz_max"] > 0
    assert window["power_w_max"] is None or window["power_w_max"] > 0
    assert set(window["throttle_reasons"]) <= set(window["reasons"])
    assert doc["invocation"]["gpu_clocks"]["gpus_visible"] >= 1
    clocks_line = [line for line in result.outlines if line.startswith("distperf: GPU clocks:")]
    assert clocks_line and "not locked" in clocks_line[0]
    assert "GpuClockWarning" in result.stdout.str() and "clocks not locked" in result.stdout.str()
    assert not torch.cuda.is_initialized()  # NVML only in the pytest process
