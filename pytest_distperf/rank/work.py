"""The work phase: what a step asks of the machine, measured in steps of its own after the timed ones.

Wall-clock time of a host-bound step varies run to run with the host; what the step asks the machine to do does
not. Per profiled step, per rank:

- ``gpu_time``: summed duration of the step's compute kernels, memcpys and memsets (CUPTI); communication
  kernels apart (``gpu_comm_time``), as their duration includes waiting for the peers;
- ``gpu_busy``: the union of every GPU activity's interval, all streams (``gpu_busy / step_time`` is the
  host-bound share, figures/quantities.py); ``kernels``: GPU kernels launched;
- ``flops`` (``FlopCounterMode``) and ``aten_ops`` (every operator call a dispatch mode sees);
- ``instructions``: user-space instructions of the rank's main thread (``perf_event_open``), where the kernel
  exposes a hardware PMU;
- on CPU, ``state_bytes`` (parameters, gradients, optimizer state) and ``step_peak_bytes`` (the most tensor bytes
  a step allocates above its start): the training state, where host RSS counts whatever the rank imports;
- ``explain``: where the step's time goes, by operator (CPU) or kernel (CUDA) and by module, from the profiler
  pass's events (rank/time_table.py defines the rows).

Three passes, so no figure is measured under another's overhead: the instruction counter, the counting modes,
the profiler. The counting pass runs in the first run of each test's runs of a job only (`counts`): its figures
are exact.
Dispatch modes are per thread: a step run on a library's own thread (Lightning's Trainer loop) has its operators
and FLOPs reported as not measured, never as zero. Whatever is not measured, `not_measured` says why.
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Any, Callable, Generator, TypeVar

from pytest_distperf.rank.probes.trace import (KERNEL_CAT, MEMCPY_CAT, MEMSET_CAT, STEP_MARK, Trace, collector_paused,
                                               export, interval, is_comm_kernel)
from pytest_distperf.rank.probes.trace import length as union_length
from pytest_distperf.rank.results import WorkResult
from pytest_distperf.rank.time_table import module_ranges, module_rows, rank_table

T = TypeVar("T")

# perf_event_open(2): a hardware counter of user-space instructions on the calling thread.
_PERF_SYSCALL = {"x86_64": 298, "aarch64": 241}
_PERF_TYPE_HARDWARE, _PERF_COUNT_HW_INSTRUCTIONS = 0, 1
_PERF_ATTR_SIZE = 112  # PERF_ATTR_SIZE_VER5
_FLAG_DISABLED, _FLAG_EXCLUDE_KERNEL, _FLAG_EXCLUDE_HV = 1 << 0, 1 << 5, 1 << 6
_IOC_ENABLE, _IOC_DISABLE, _IOC_RESET = 0x2400, 0x2401, 0x2403


class InstructionCounter:
    """User-space instructions retired by the calling thread; `open()` returns None and `why` says why not."""

    why: str = ""

    def __init__(self, fd: int):
        self.fd = fd
        self._libc = ctypes.CDLL(None, use_errno=True)

    @classmethod
    def open(cls) -> "InstructionCounter | None":
        nr = _PERF_SYSCALL.get(platform.machine())
        if nr is None:
            cls.why = f"perf_event_open is not wired for {platform.machine()}"
            return None
        attr = (ctypes.c_uint8 * 128)()
        ctypes.memmove(attr, (ctypes.c_uint32 * 2)(_PERF_TYPE_HARDWARE, _PERF_ATTR_SIZE), 8)
        ctypes.memmove(ctypes.addressof(attr) + 8, (ctypes.c_uint64 * 1)(_PERF_COUNT_HW_INSTRUCTIONS), 8)
        flags = _FLAG_DISABLED | _FLAG_EXCLUDE_KERNEL | _FLAG_EXCLUDE_HV
        ctypes.memmove(ctypes.addressof(attr) + 40, (ctypes.c_uint64 * 1)(flags), 8)
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.syscall(nr, attr, 0, -1, -1, ctypes.c_ulong(0))  # this thread, any CPU, no group
        if fd < 0:
            err = ctypes.get_errno()
            cls.why = (f"no hardware instruction counter here (perf_event_open: {os.strerror(err)}; "
                       f"perf_event_paranoid {_read('/proc/sys/kernel/perf_event_paranoid')}): a virtual machine "
                       f"or container without a PMU, or a seccomp filter")
            return None
        return cls(fd)

    def _ioctl(self, request: int) -> None:
        self._libc.ioctl(self.fd, request, 0)

    def start(self) -> None:
        self._ioctl(_IOC_RESET)
        self._ioctl(_IOC_ENABLE)

    def stop(self) -> int:
        self._ioctl(_IOC_DISABLE)
        return int.from_bytes(os.read(self.fd, 8), "little")

    def close(self) -> None:
        os.close(self.fd)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "unreadable"


def _op_counter() -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        """Counts every operator call dispatched on this thread."""

        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.calls += 1
            return func(*args, **(kwargs or {}))

    return OpCounter()


def _storage_bytes(tensors: list[Any]) -> int:
    """Bytes of the distinct storages behind these tensors (a view or a shared flat buffer counts once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor's shard on this rank
        local = getattr(local, "ds_tensor", None) if local.numel() == 0 and hasattr(local, "ds_tensor") else local
        if local is None or local.numel() == 0:
            continue
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def state_bytes(model: Any, optimizer: Any) -> int:
    """Tensor bytes of the training state on this rank: parameters (a shard's, a DeepSpeed partition's), their
    gradients, and the optimizer's parameters (master copies) and state."""
    tensors: list[Any] = []
    if model is not None:
        for p in model.parameters():
            tensors.append(p)
            if p.grad is not None:
                tensors.append(p.grad)
    if optimizer is not None:
        tensors += [p for g in optimizer.param_groups for p in g["params"]] + list(optimizer.state.keys())
        for state in optimizer.state.values():
            tensors += [v for v in state.values() if hasattr(v, "untyped_storage") and v.dim() > 0]
    return _storage_bytes([t for t in tensors if hasattr(t, "untyped_storage")])


def measure(step: Callable[[int], Any], steps: int, sync: Callable[[], None], device: Any,
            model: Any = None, optimizer: Any = None, counts: bool = True) -> WorkResult:
    """The work figures of `steps` steps a pass, the harness calling each: step(i) runs the pass's i-th step."""
    return drive(passes(steps, sync, device, model, optimizer, counts), step)


def drive(phase: Generator[int, None, T], step: Callable[[int], Any]) -> T:
    """Run a phase written as a generator (`passes`, probes/runner.probe_passes) on steps the harness calls: at
    each `yield i`, step(i)."""
    try:
        i = next(phase)
        while True:
            step(i)
            i = phase.send(None)
    except StopIteration as done:
        return done.value


def passes(steps: int, sync: Callable[[], None], device: Any, model: Any = None, optimizer: Any = None,
           counts: bool = True) -> Generator[int, None, WorkResult]:
    """The passes as a generator that yields i where the pass's i-th step runs and is resumed once it has run;
    it returns the WorkResult. The harness's own steps (`measure`) and a script's optimizer steps
    (rank/script_steps.py) drive the same passes. `counts`: also the counting pass (FLOPs, operators)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from pytest_distperf.rank.probes.recorder import profile_all_threads

    cuda = device.type == "cuda"
    result = WorkResult(steps=steps)

    counter = InstructionCounter.open()
    if counter is None:
        result.not_measured["instructions"] = InstructionCounter.why
    else:
        try:
            per_step = []
            for i in range(steps):
                sync()
                counter.start()
                yield i
                sync()
                per_step.append(counter.stop())
            result.instructions = per_step
        finally:
            counter.close()

    if counts:
        yield from _count(result, steps, sync)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # Every thread's launches on CUDA (autograd's device threads); on CPU that switch would drop the
    # allocation events, and a CPU step's allocations happen on the thread that runs it.
    with profile(activities=activities, profile_memory=not cuda, **(profile_all_threads() if cuda else {})) as prof, \
            module_ranges():
        for i in range(steps):
            sync()
            with record_function(STEP_MARK):
                yield i
                sync()
    with collector_paused():
        _from_trace(result, export(prof, complete_only=False), steps, cuda)
    if not cuda:
        result.state_bytes = state_bytes(model, optimizer)
    return result


def _from_trace(result: WorkResult, events: list[dict[str, Any]], steps: int, cuda: bool) -> None:
    """The profiler pass's figures: the time table, and the GPU figures (CUDA) or the steps' allocation peaks."""
    trace = Trace([e for e in events if e.get("ph") == "X"])
    if len(trace.steps) != steps:
        raise RuntimeError(f"work phase: the trace holds {len(trace.steps)} {STEP_MARK} ranges for {steps} steps")
    result.explain = {**rank_table(trace, cuda), **(result.explain or {})}  # the counting pass's flops: rows
    if cuda:
        _gpu_figures(result, trace)
    else:
        result.not_measured["gpu_time"] = "needs CUDA: a CPU job runs no kernels"
        result.step_peak_bytes = _step_peaks(trace.steps, [e for e in events if e.get("name") == "[memory]"])


def _count(result: WorkResult, steps: int, sync: Callable[[], None]) -> Generator[int, None, None]:
    """The counting pass: operators dispatched and FLOPs per step."""
    from torch.utils.flop_counter import FlopCounterMode

    ops, flops = _op_counter(), FlopCounterMode(display=False)
    op_counts: list[int] = []
    flop_counts: list[int] = []
    with ops, flops:
        for i in range(steps):
            sync()
            o0, f0 = ops.calls, flops.get_total_flops()
            yield i
            sync()
            op_counts.append(ops.calls - o0)
            flop_counts.append(int(flops.get_total_flops() - f0))
    if not any(op_counts):
        why = ("the step runs on another thread than the measurement (the library's own loop): operator dispatch "
               "modes are per thread")
        result.not_measured["aten_ops"] = result.not_measured["flops"] = why
    else:
        result.aten_ops, result.flops = op_counts, flop_counts
        result.explain = module_rows(flops.get_flop_counts(), steps)


def _gpu_figures(result: WorkResult, trace: Trace) -> None:
    steps = len(trace.steps)
    compute = [0.0] * steps
    comm = [0.0] * steps
    copies = [0.0] * steps
    kernels = [0] * steps
    busy: list[list[tuple[float, float]]] = [[] for _ in range(steps)]
    for e in trace.of_cat(KERNEL_CAT, MEMCPY_CAT, MEMSET_CAT):
        i = trace.gpu_step(e)
        if i is None:
            continue
        dur = float(e.get("dur", 0.0)) * 1e-6
        busy[i].append(interval(e))
        if e.get("cat") != KERNEL_CAT:
            copies[i] += dur
        elif is_comm_kernel(e.get("name", "")):
            comm[i] += dur
            kernels[i] += 1
        else:
            compute[i] += dur
            kernels[i] += 1
    result.gpu_time = [c + m for c, m in zip(compute, copies)]
    result.gpu_compute_time, result.gpu_comm_time, result.gpu_copy_time = compute, comm, copies
    result.gpu_busy = [union_length(b) * 1e-6 for b in busy]
    result.kernels = kernels


def _step_peaks(ranges: list[tuple[float, float]], memory: list[dict[str, Any]]) -> list[int]:
    """Per step range, the most CPU tensor bytes allocated above the step's start (the profiler's allocation
    events: its running total counts what was allocated while it profiled)."""
    cpu = sorted(((e["ts"], int((e.get("args") or {}).get("Total Allocated", 0))) for e in memory
                  if (e.get("args") or {}).get("Device Type", 0) == 0), key=lambda x: x[0])
    peaks = []
    for start, end in ranges:
        before = [total for ts, total in cpu if ts < start]
        base = before[-1] if before else 0
        inside = [total for ts, total in cpu if start <= ts <= end]
        peaks.append(max([base] + inside) - base)
    return peaks
