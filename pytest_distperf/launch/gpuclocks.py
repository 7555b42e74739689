"""Locked GPU clocks for a session (`--distperf-lock-gpu-clocks[=MHZ|external]`), always given back.

A GPU left to boost moves step times between runs. The pytest process (the xdist controller) locks the graphics
clock of every GPU the session may use through NVML (no CUDA context) and unlocks it when the session ends
(pytest_unconfigure, atexit, SIGTERM/SIGHUP). What was locked is written first to a state file in the lock folder,
so the next session gives back what a killed one left locked, unless another live session holds it. Where locking
is refused nothing stays locked and CUDA tests are skipped with the reason. xdist workers read the controller's
state file, named in DISTPERF_GPU_CLOCKS_STATE.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import json
import os
import signal
import threading
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from pytest_distperf.errors import SettingsError, UnsafeFolderError
from pytest_distperf.launch.devices import nvml_text
from pytest_distperf.spec.settings import CLOCKS_DEFAULT as DEFAULT, CLOCKS_EXTERNAL as EXTERNAL

STATE_PREFIX = "gpu-clocks-"
STATE_ENV = "DISTPERF_GPU_CLOCKS_STATE"
SIGNALS = ("SIGTERM", "SIGHUP")
# What NVML_ERROR_NOT_SUPPORTED (3) and NVML_ERROR_NO_PERMISSION (4) mean here.
NVML_PROBLEMS = {3: "locked clocks are not supported on this GPU (Volta or newer, not MIG or a virtual GPU)",
                 4: "no permission to lock GPU clocks (it needs root)"}


@dataclass
class LockedGpu:
    uuid: str
    index: int  # NVML index
    name: str
    mhz: int


@dataclass
class ClockState:
    """The state file of one session: what it locked (and must give back), or why it locked nothing."""

    pid: int
    started: str | None  # the process's start time (/proc), so a reused pid is not taken for the session
    requested: str | int | None
    locked: list[LockedGpu] = field(default_factory=list)
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "ClockState":
        return cls(pid=int(d["pid"]), started=d.get("started"), requested=d.get("requested"),
                   locked=[LockedGpu(**g) for g in d.get("locked") or []], problem=d.get("problem"))


def process_start(pid: int) -> str | None:
    """The kernel's start time of a process (field 22 of /proc/PID/stat), or None where it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()[19]


def is_alive(state: ClockState) -> bool:
    """The session that wrote `state` still runs (same pid and, where /proc says, the same start time)."""
    start = process_start(state.pid)
    if start is None:
        try:
            os.kill(state.pid, 0)  # no /proc (not Linux): the pid alone
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return state.started is None
    return state.started is None or start == state.started


def read_states(folder: str) -> dict[str, ClockState]:
    """Every session's state file in `folder`; an unreadable one is skipped (its session rewrites or removes it)."""
    from pytest_distperf.fs.safefs import check_private_folder, open_nofollow

    check_private_folder(folder)  # another user's folder: refused (UnsafeFolderError), never read
    out = {}
    for path in sorted(glob.glob(os.path.join(folder, STATE_PREFIX + "*.json"))):
        try:
            with os.fdopen(open_nofollow(path, os.O_RDONLY)) as f:  # a symlink planted there is not followed
                out[path] = ClockState.from_json(json.load(f))
        except (OSError, ValueError, KeyError, TypeError, UnsafeFolderError):  # a planted symlink: skipped
            continue
    return out


def _live_locks(states: dict[str, ClockState], but: str | None = None) -> set[str]:
    """GPUs that the live sessions of `states` (but the one whose state file is `but`) hold locked."""
    return {g.uuid for p, s in states.items() if p != but and is_alive(s) for g in s.locked}


def stale_to_reset(states: dict[str, ClockState]) -> tuple[list[str], list[LockedGpu]]:
    """(state files of dead sessions, their GPUs that no live session holds locked)."""
    live = _live_locks(states)
    dead = [p for p, s in states.items() if not is_alive(s)]
    reset = {g.uuid: g for p in dead for g in states[p].locked if g.uuid not in live}
    return dead, list(reset.values())


def locked_uuids(folder: str) -> set[str]:
    return _live_locks(read_states(folder))


def match_visible(ids: list[str], uuids: list[str]) -> list[int | None]:
    """NVML indices of the GPUs CUDA_VISIBLE_DEVICES names (indices, or UUIDs full or a unique prefix); None where
    an entry names no single GPU (a MIG instance: its clocks are its parent's). Indices are taken as NVML's."""
    out: list[int | None] = []
    for v in ids:
        hits = [int(v)] if v.isdigit() else [i for i, u in enumerate(uuids) if u.startswith(v)]
        out.append(hits[0] if len(hits) == 1 and hits[0] < len(uuids) else None)
    return out


def nvml_problem(e: Exception) -> str:
    return f"NVML: {NVML_PROBLEMS.get(getattr(e, 'value', None), e)}"


def _default_mhz(nvml: Any, h: Any) -> int:
    for read in (lambda: nvml.nvmlDeviceGetClock(h, nvml.NVML_CLOCK_GRAPHICS, nvml.NVML_CLOCK_ID_APP_CLOCK_DEFAULT),
                 lambda: nvml.nvmlDeviceGetDefaultApplicationsClock(h, nvml.NVML_CLOCK_GRAPHICS),
                 lambda: nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_GRAPHICS)):
        try:
            mhz = int(read())
        except Exception:  # NVMLError, or a function this pynvml lacks
            continue
        if mhz > 0:
            return mhz
    raise SettingsError("--distperf-lock-gpu-clocks: NVML reports no default or maximum graphics clock for this "
                        "GPU; give one: --distperf-lock-gpu-clocks=MHZ")


class SessionClocks:
    """The session's GPU clocks: lock (controller), report (header, skip reason, which GPUs are locked), unlock."""

    def __init__(self, setting: str | int | None, folder: str, controller: bool = True):
        self.setting = setting
        self.folder = folder
        self.controller = controller
        self.state: ClockState | None = None
        self.gpus_visible = 0
        self.notes: list[str] = []  # what the header says besides the lock itself (stale locks given back)
        self.path = os.path.join(folder, f"{STATE_PREFIX}{os.getpid()}.json")
        self._restored = False
        self._guard = threading.Lock()
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self.setting not in (None, EXTERNAL)

    @property
    def problem(self) -> str | None:
        if self.requested and self.state is None and self.gpus_visible:
            return "no lock state from the controlling pytest process"
        return self.state.problem if self.state else None

    def skip_reason(self) -> str | None:
        """Why CUDA tests are skipped: locked clocks were asked for and could not be had."""
        if self.requested and self.gpus_visible and self.problem:
            return f"--distperf-lock-gpu-clocks: GPU clocks not locked ({self.problem})"
        return None

    def locked_uuids(self) -> set[str] | None:
        """GPUs locked by distperf now (this session or another live one); None when locked outside pytest."""
        return None if self.setting == EXTERNAL else locked_uuids(self.folder)

    def header_lines(self) -> list[str]:
        if not self.gpus_visible:
            return ["distperf: GPU clocks: no GPU visible, nothing to lock"] if self.requested else []
        if self.setting == EXTERNAL:
            line = "GPU clocks: locked outside pytest (--distperf-lock-gpu-clocks=external); throttling is still read"
        elif self.state and self.state.locked:
            mhz = sorted({g.mhz for g in self.state.locked})
            line = (f"GPU clocks: locked at {', '.join(map(str, mhz))} MHz on {len(self.state.locked)} GPU(s) "
                    f"for this session (unlocked when it ends)")
        elif self.requested:
            line = f"GPU clocks: not locked ({self.problem}); CUDA tests are skipped"
        else:
            line = "GPU clocks: not locked (--distperf-lock-gpu-clocks locks them); CUDA tests warn"
        return [f"distperf: {line}", *(f"distperf: {n}" for n in self.notes)]

    def record(self) -> dict[str, Any]:
        """For the JSON report: what was asked, what is locked, and why not."""
        return {"requested": self.setting, "gpus_visible": self.gpus_visible,
                "locked": [asdict(g) for g in self.state.locked] if self.state else [],
                "problem": self.problem, "notes": list(self.notes)}

    def start(self, gpu_ids: list[str], nvml_module: Callable[[], Any] | None = None) -> None:
        """Give back what dead sessions left locked, then lock `gpu_ids` (CUDA_VISIBLE_DEVICES names) when asked."""
        self.gpus_visible = len(gpu_ids)
        if not self.controller:
            self.state = self._controller_state()
            return
        if not gpu_ids:
            return
        nvml = (nvml_module or _pynvml)()
        problem = "nvidia-ml-py is not installed: pip install nvidia-ml-py" if nvml is None else None
        if nvml is not None:
            try:
                nvml.nvmlInit()
            except Exception as e:
                problem = nvml_problem(e)
        if problem:
            if self.requested:
                self._write(self._new_state(problem))
            return
        try:
            self._give_back_stale(nvml)
            if self.requested:
                self._lock(nvml, gpu_ids)
        finally:
            nvml.nvmlShutdown()

    def _give_back_stale(self, nvml: Any) -> None:
        dead, reset = stale_to_reset(read_states(self.folder))
        failed = []
        for g in reset:
            try:
                nvml.nvmlDeviceResetGpuLockedClocks(nvml.nvmlDeviceGetHandleByUUID(g.uuid))
            except Exception as e:
                failed.append(f"{g.uuid}: {nvml_problem(e)}")
        if failed:
            self.notes.append(f"could not unlock GPU clocks a killed session left locked ({'; '.join(failed)}); "
                              f"`nvidia-smi -rgc` as root does")
            return
        for path in dead:
            with contextlib.suppress(OSError):
                os.unlink(path)
        if reset:
            self.notes.append(f"unlocked GPU clocks a killed session left locked: {', '.join(g.uuid for g in reset)}")

    def _lock(self, nvml: Any, gpu_ids: list[str]) -> None:
        count = int(nvml.nvmlDeviceGetCount())
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [nvml_text(nvml.nvmlDeviceGetUUID(h)) for h in handles]
        state = self._new_state()
        indices = match_visible(gpu_ids, uuids)
        if None in indices:
            state.problem = (f"CUDA_VISIBLE_DEVICES entries that name no single GPU: "
                             f"{[v for v, i in zip(gpu_ids, indices) if i is None]}")
            self._write(state)
            return
        targets = []
        for i in dict.fromkeys(indices):  # in order, once each
            h = handles[i]
            mhz = _default_mhz(nvml, h) if self.setting == DEFAULT else int(self.setting)  # type: ignore[arg-type]
            top = int(nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_GRAPHICS))
            name = nvml_text(nvml.nvmlDeviceGetName(h))
            if top and mhz > top:
                raise SettingsError(f"--distperf-lock-gpu-clocks={mhz}: above the maximum graphics clock of GPU {i} "
                                    f"({name}: {top} MHz)")
            targets.append(LockedGpu(uuid=uuids[i], index=i, name=name, mhz=mhz))
        # Written before the first lock: a session killed in between still leaves word of what to give back.
        state.locked = list(targets)
        self._write(state)
        self._install_restorers()
        done = []
        for g in targets:
            try:
                nvml.nvmlDeviceSetGpuLockedClocks(handles[g.index], g.mhz, g.mhz)
            except Exception as e:
                state.problem = f"{nvml_problem(e)} (GPU {g.index}, {g.name})"
                break
            done.append(g)
        if state.problem:  # all or none: one side of a comparison must not run locked and the other not
            left = []
            for g in done:
                try:
                    nvml.nvmlDeviceResetGpuLockedClocks(handles[g.index])
                except Exception:
                    left.append(g)  # still listed: restore() or the next session gives it back
            state.locked = left
            self._write(state)

    def restore(self) -> None:
        """Unlock what this session locked, unless another live session holds it; then drop the state file.
        Idempotent, and safe from a signal handler (a second call while one runs does nothing)."""
        if not self.controller or self._restored or not self._guard.acquire(blocking=False):
            return
        try:
            if self.state is None or self._restored:
                return
            others = _live_locks(read_states(self.folder), but=self.path)
            mine = [g for g in self.state.locked if g.uuid not in others]
            if mine:
                nvml = _pynvml()
                if nvml is None:
                    return
                nvml.nvmlInit()
                try:
                    for g in mine:
                        nvml.nvmlDeviceResetGpuLockedClocks(nvml.nvmlDeviceGetHandleByUUID(g.uuid))
                finally:
                    nvml.nvmlShutdown()
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            if os.environ.get(STATE_ENV) == self.path:
                del os.environ[STATE_ENV]
            self._restored = True
            self._uninstall_restorers()
        except Exception:  # left as it is: the state file stays, and the next session gives the clocks back
            pass
        finally:
            self._guard.release()

    def _new_state(self, problem: str | None = None) -> ClockState:
        return ClockState(os.getpid(), process_start(os.getpid()), self.setting, problem=problem)

    def _write(self, state: ClockState) -> None:
        from pytest_distperf.fs.jsonio import write_json_atomic

        self.state = state
        write_json_atomic(self.path, state.to_json(), lock=False)
        os.environ[STATE_ENV] = self.path  # xdist workers, started after this, read it

    def _controller_state(self) -> ClockState | None:
        path = os.environ.get(STATE_ENV)
        return read_states(os.path.dirname(path)).get(path) if path else None

    def _install_restorers(self) -> None:
        atexit.register(self.restore)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (getattr(signal, name) for name in SIGNALS if hasattr(signal, name)):
            self._previous[sig] = signal.signal(sig, self._on_signal)

    def _uninstall_restorers(self) -> None:
        """Put back the handlers found, where ours are still in place (a later in-process session starts clean)."""
        atexit.unregister(self.restore)
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._on_signal:
                signal.signal(sig, previous)
        self._previous.clear()

    def _on_signal(self, signum: int, frame: Any) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)  # before restore() puts it back
        self.restore()
        if callable(previous):
            previous(signum, frame)
            return
        if previous == signal.SIG_IGN:
            return
        signal.signal(signum, signal.SIG_DFL)  # die of the signal, as without distperf
        os.kill(os.getpid(), signum)


def _pynvml() -> Any:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml
