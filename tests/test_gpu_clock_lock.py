"""--distperf-lock-gpu-clocks (launch/gpuclocks.py): the setting, which GPUs a session's CUDA_VISIBLE_DEVICES
names, the state files that let a later session unlock what a killed one locked, and what the session shows
and skips. The NVML calls themselves run on a GPU box (the verification commands in the issue note); the
bookkeeping around them is checked here against a stand-in that records the calls."""

from __future__ import annotations

from importlib.metadata import entry_points
import json
import os
import subprocess
import sys

import pytest
import torch

from pytest_distperf.spec import settings as config
from pytest_distperf.spec.settings import build_settings
from pytest_distperf.errors import SettingsError
from pytest_distperf.launch import gpuclocks
from pytest_distperf.launch.gpuclocks import (ClockState, LockedGpu, SessionClocks, match_visible, process_start,
                                             read_states, stale_to_reset)
from pytest_distperf.spec.settings import parse_clock_setting as parse_setting


@pytest.mark.parametrize("value,expected", [(None, None), ("", None), ("false", None), (False, None),
                                            ("default", "default"), ("true", "default"), (True, "default"),
                                            ("1410", 1410), ("external", "external"), ("EXTERNAL", "external")])
def test_the_setting(value, expected):
    assert parse_setting(value, "--distperf-lock-gpu-clocks") == expected


def test_a_bad_setting_names_the_option_and_a_swallowed_path_says_how(tmp_path):
    with pytest.raises(SettingsError, match=r"ini option distperf_lock_gpu_clocks: expected .* got 'fast'"):
        parse_setting("fast", "ini option distperf_lock_gpu_clocks")
    with pytest.raises(SettingsError, match="write --distperf-lock-gpu-clocks=MHZ"):
        parse_setting(str(tmp_path), "--distperf-lock-gpu-clocks")


def test_settings_carry_it_from_the_command_line_or_the_ini():
    assert build_settings(True, {}, {}).lock_gpu_clocks is None
    assert build_settings(True, {"lock_gpu_clocks": "default"}, {}).lock_gpu_clocks == "default"
    assert build_settings(True, {}, {"lock_gpu_clocks": "1500"}).lock_gpu_clocks == 1500
    with pytest.raises(SettingsError, match="ini option distperf_lock_gpu_clocks"):
        build_settings(True, {}, {"lock_gpu_clocks": "sometimes"})


def test_visible_gpus_map_to_nvml_by_index_or_uuid():
    uuids = ["GPU-aaaa-1", "GPU-bbbb-2", "GPU-bbbc-3"]
    assert match_visible(["1", "0"], uuids) == [1, 0]
    assert match_visible(["GPU-aaaa-1", "GPU-bbbc"], uuids) == [0, 2]  # full, or a unique prefix (as CUDA takes)
    assert match_visible(["GPU-bbb", "7", "MIG-0f0f"], uuids) == [None, None, None]  # ambiguous, absent, MIG


def _dead_pid() -> tuple[int, str | None]:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    start = process_start(p.pid)
    p.kill()
    p.wait()
    return p.pid, start


def _write(folder, name: str, state: ClockState) -> str:
    path = os.path.join(folder, f"gpu-clocks-{name}.json")
    with open(path, "w") as f:
        json.dump(state.to_json(), f)
    return path


def test_a_killed_sessions_gpus_are_given_back_unless_a_live_session_holds_them(tmp_path):
    pid, start = _dead_pid()
    a, b, c = (LockedGpu(uuid=f"GPU-{x}", index=i, name="H200", mhz=1980) for i, x in enumerate("abc"))
    dead = _write(tmp_path, "dead", ClockState(pid, start, "default", locked=[a, b]))
    _write(tmp_path, "live", ClockState(os.getpid(), process_start(os.getpid()), "default", locked=[b, c]))
    (tmp_path / "gpu-clocks-torn.json").write_text("{")  # a torn file is skipped, not fatal
    states = read_states(str(tmp_path))
    assert len(states) == 2
    files, reset = stale_to_reset(states)
    assert files == [dead] and reset == [a]
    assert gpuclocks.locked_uuids(str(tmp_path)) == {"GPU-b", "GPU-c"}


def test_a_reused_pid_is_not_taken_for_the_session_that_wrote_the_file():
    me = os.getpid()
    assert gpuclocks.is_alive(ClockState(me, process_start(me), None))
    assert not gpuclocks.is_alive(ClockState(me, "1", None))  # same pid, another start time


class FakeNvml:
    """Records lock/unlock calls; `refuse` makes SetGpuLockedClocks fail with that NVML error code."""

    NVML_CLOCK_GRAPHICS, NVML_CLOCK_ID_APP_CLOCK_DEFAULT = 0, 2

    class NVMLError(Exception):
        def __init__(self, value: int):
            super().__init__({3: "Not Supported", 4: "Insufficient Permissions"}.get(value, "Unknown Error"))
            self.value = value

    def __init__(self, gpus: int = 2, refuse: int | None = None, refuse_from: int = 0):
        self.uuids = [f"GPU-{i:04d}" for i in range(gpus)]
        self.refuse, self.refuse_from = refuse, refuse_from
        self.locked: dict[str, int] = {}
        self.calls: list[str] = []

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return len(self.uuids)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self.uuids.index(uuid)

    def nvmlDeviceGetUUID(self, h):
        return self.uuids[h]

    def nvmlDeviceGetName(self, h):
        return b"NVIDIA H200"

    def nvmlDeviceGetClock(self, h, kind, clock_id):
        return 1980

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceSetGpuLockedClocks(self, h, lo, hi):
        if self.refuse is not None and h >= self.refuse_from:
            raise self.NVMLError(self.refuse)
        self.calls.append(f"lock {h} {lo}-{hi}")
        self.locked[self.uuids[h]] = lo

    def nvmlDeviceResetGpuLockedClocks(self, h):
        self.calls.append(f"reset {h}")
        self.locked.pop(self.uuids[h], None)


@pytest.fixture
def clean_env(monkeypatch):
    monkeypatch.delenv(gpuclocks.STATE_ENV, raising=False)
    monkeypatch.setattr(SessionClocks, "_install_restorers", lambda self: None)


def test_lock_then_restore_and_the_state_file_says_what_is_locked(tmp_path, monkeypatch, clean_env):
    nvml = FakeNvml()
    monkeypatch.setattr(gpuclocks, "_pynvml", lambda: nvml)
    clocks = SessionClocks("default", str(tmp_path))
    clocks.start(["1", "0"])
    assert nvml.locked == {"GPU-0001": 1980, "GPU-0000": 1980}
    state = json.loads((tmp_path / f"gpu-clocks-{os.getpid()}.json").read_text())
    assert [g["uuid"] for g in state["locked"]] == ["GPU-0001", "GPU-0000"] and state["problem"] is None
    assert os.environ[gpuclocks.STATE_ENV].endswith(f"gpu-clocks-{os.getpid()}.json")
    assert clocks.header_lines() == ["distperf: GPU clocks: locked at 1980 MHz on 2 GPU(s) for this session "
                                     "(unlocked when it ends)"]
    assert clocks.skip_reason() is None and clocks.locked_uuids() == {"GPU-0000", "GPU-0001"}
    worker = SessionClocks("default", str(tmp_path), controller=False)  # an xdist worker, from the env
    worker.start(["0", "1"])
    assert worker.skip_reason() is None and [g.uuid for g in worker.state.locked] == ["GPU-0001", "GPU-0000"]
    clocks.restore()
    clocks.restore()  # idempotent
    assert nvml.locked == {} and nvml.calls.count("reset 0") == 1
    assert not list(tmp_path.glob("gpu-clocks-*.json")) and gpuclocks.STATE_ENV not in os.environ


def test_refused_locking_leaves_nothing_locked_and_skips_cuda_tests_with_the_reason(tmp_path, monkeypatch, clean_env):
    nvml = FakeNvml(refuse=4, refuse_from=1)  # GPU 0 locks, GPU 1 refuses: all or none
    monkeypatch.setattr(gpuclocks, "_pynvml", lambda: nvml)
    clocks = SessionClocks("default", str(tmp_path))
    clocks.start(["0", "1"])
    assert nvml.locked == {} and nvml.calls == ["lock 0 1980-1980", "reset 0"]
    reason = clocks.skip_reason()
    assert reason == ("--distperf-lock-gpu-clocks: GPU clocks not locked (NVML: no permission to lock GPU clocks "
                      "(it needs root) (GPU 1, NVIDIA H200))")
    assert "not locked (NVML: no permission" in clocks.header_lines()[0]
    assert clocks.record()["locked"] == [] and "no permission" in clocks.record()["problem"]
    from pytest_distperf.session import DistPerfSession

    session = DistPerfSession.__new__(DistPerfSession)
    session.gpu_clocks = clocks
    cuda = config.TestPlan(device="cuda", world_size=1, timeout=60.0, repeats=3)
    cpu = config.TestPlan(device="cpu", world_size=2, timeout=60.0, repeats=3)
    assert session.with_clock_skip(cuda).skip_reason == reason and session.with_clock_skip(cuda).device is None
    assert session.with_clock_skip(cpu) is cpu


def test_without_the_option_nothing_is_locked_and_the_header_says_so(tmp_path, monkeypatch, clean_env):
    nvml = FakeNvml()
    monkeypatch.setattr(gpuclocks, "_pynvml", lambda: nvml)
    clocks = SessionClocks(None, str(tmp_path))
    clocks.start(["0"])
    assert nvml.calls == [] and clocks.skip_reason() is None and clocks.locked_uuids() == set()
    assert clocks.header_lines() == ["distperf: GPU clocks: not locked (--distperf-lock-gpu-clocks locks them); "
                                     "CUDA tests warn"]
    external = SessionClocks("external", str(tmp_path))
    external.start(["0"])
    assert external.locked_uuids() is None and "locked outside pytest" in external.header_lines()[0]


def test_a_mhz_above_the_gpus_maximum_is_a_usage_error(tmp_path, monkeypatch, clean_env):
    monkeypatch.setattr(gpuclocks, "_pynvml", lambda: FakeNvml())
    with pytest.raises(SettingsError, match=r"--distperf-lock-gpu-clocks=2500: above the maximum graphics clock of "
                                            r"GPU 0 \(NVIDIA H200: 1980 MHz\)"):
        SessionClocks(2500, str(tmp_path)).start(["0"])


def test_the_next_session_unlocks_what_a_killed_one_left_locked(tmp_path, monkeypatch, clean_env):
    pid, start = _dead_pid()
    nvml = FakeNvml()
    nvml.locked = {"GPU-0001": 1500}
    _write(tmp_path, str(pid), ClockState(pid, start, 1500, locked=[LockedGpu("GPU-0001", 1, "H200", 1500)]))
    monkeypatch.setattr(gpuclocks, "_pynvml", lambda: nvml)
    clocks = SessionClocks(None, str(tmp_path))  # even a session that locks nothing gives them back
    clocks.start(["0", "1"])
    assert nvml.locked == {} and nvml.calls == ["reset 1"]
    assert not list(tmp_path.glob("gpu-clocks-*.json"))
    assert "unlocked GPU clocks a killed session left locked: GPU-0001" in clocks.header_lines()[1]


def test_sigterm_unlocks_and_then_dies_of_the_signal(tmp_path):
    """A real process: locks (stand-in NVML), is sent SIGTERM, and is gone with the clocks given back."""
    script = f"""
import os, signal, sys, time
sys.path.insert(0, {os.getcwd()!r})
sys.path.insert(0, {os.path.dirname(__file__)!r})
from test_gpu_clock_lock import FakeNvml
from pytest_distperf.launch import gpuclocks
from pytest_distperf.launch.devices import visible_gpu_count
nvml = FakeNvml()
gpuclocks._pynvml = lambda: nvml
clocks = gpuclocks.SessionClocks("default", {str(tmp_path)!r})
clocks.start(["0"])
_reset = nvml.nvmlDeviceResetGpuLockedClocks
def reset(h):
    _reset(h)
    open({str(tmp_path / "reset")!r}, "w").write(str(h))
nvml.nvmlDeviceResetGpuLockedClocks = reset
print("locked", flush=True)
time.sleep(30)
"""
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "locked"
    assert list(tmp_path.glob("gpu-clocks-*.json"))
    p.terminate()
    assert p.wait(timeout=20) == -15  # died of SIGTERM, as without distperf
    assert (tmp_path / "reset").read_text() == "0"
    assert not list(tmp_path.glob("gpu-clocks-*.json"))


# Where the package is on the path but not installed (no pytest11 entry point), the inner runs load it by name.
PLUGIN = ([] if any(ep.name == "distperf" for ep in entry_points(group="pytest11"))
          else ["-p", "pytest_distperf.plugin"])
@pytest.mark.gpu(nvml=True, reason="locks real GPU clocks through NVML")
def test_a_session_locks_the_gpu_clocks_or_skips_with_the_reason_and_leaves_nothing_locked(pytester, monkeypatch,
                                                                                          tmp_path):
    """With root: the header names the locked clock, the job's GPU ran at it (median sample) unless a throttle
    reason says why not, and the session's state file is gone afterwards. Without: the CUDA test is skipped with
    NVML's reason."""
    monkeypatch.setenv("DISTPERF_LOCK_DIR", str(tmp_path))
    monkeypatch.delenv(gpuclocks.STATE_ENV, raising=False)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.distperf(world_size=1, device="cuda")
        def test_job(distperf):
            run = distperf.run("ddp", shape="small", steps=20)
            w = run.ranks[0].gpu_window
            print("WINDOW", w.sm_mhz_median, sorted(w.reasons))
    """)
    result = pytester.runpytest(*PLUGIN, "--distperf", "-p", "no:cacheprovider", "--distperf-lock-gpu-clocks", "-s",
                                "-rs")
    header = [line for line in result.outlines if line.startswith("distperf: GPU clocks:")]
    assert header, result.outlines[:10]
    if "locked at" in header[0]:
        result.assert_outcomes(passed=1)
        mhz = int(header[0].split("locked at ")[1].split()[0].rstrip(","))
        # -s: the print lands on the test's progress line ("test_x.py WINDOW 1980.0 []")
        window = next(line for line in result.outlines if "WINDOW " in line).split("WINDOW ", 1)[1]
        window = ["WINDOW", *window.split(maxsplit=1)]
        assert float(window[1]) == mhz or "sw_power_cap" in window[2] or "slowdown" in window[2], (header, window)
    else:
        assert "not locked (NVML:" in header[0] or "not locked (nvidia-ml-py" in header[0], header
        result.assert_outcomes(skipped=1)
        assert "--distperf-lock-gpu-clocks: GPU clocks not locked" in result.stdout.str()
    assert not list(tmp_path.glob("gpu-clocks-*.json"))  # unlocked, state dropped
    assert not torch.cuda.is_initialized()


def test_the_signal_handlers_go_once_the_clocks_are_unlocked(tmp_path, monkeypatch):
    import signal

    monkeypatch.delenv(gpuclocks.STATE_ENV, raising=False)
    nvml = FakeNvml()
    monkeypatch.setattr(gpuclocks, "_pynvml", lambda: nvml)
    seen: list[int] = []
    before = signal.signal(signal.SIGHUP, lambda signum, frame: seen.append(signum))
    try:
        clocks = SessionClocks("default", str(tmp_path))
        clocks.start(["0"])
        assert signal.getsignal(signal.SIGHUP) == clocks._on_signal
        os.kill(os.getpid(), signal.SIGHUP)  # unlocks, then hands the signal to the handler that was there
        assert nvml.locked == {} and seen == [signal.SIGHUP]
        assert signal.getsignal(signal.SIGHUP) != clocks._on_signal
    finally:
        signal.signal(signal.SIGHUP, before)
