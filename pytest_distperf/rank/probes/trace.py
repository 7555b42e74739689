"""Reading the Chrome trace that torch.profiler exports (Kineto's JSON), and interval arithmetic.

The probe phase exports this file anyway (it is what a user opens in Perfetto), so the
device-side probes read it rather than a second, private source. What Kineto writes:

- ``cat: "user_annotation"``: ``record_function`` ranges on a CPU thread, e.g. our
  ``distperf:step`` and torch.optim's ``Optimizer.step#AdamW.step``. On CUDA Kineto also
  writes a ``gpu_user_annotation`` copy on the GPU timeline; we read the CPU one.
- ``cat: "cpu_op"``: ATen/c10d operators on the thread that called them.
- ``cat: "cuda_runtime"`` / ``"cuda_driver"``: ``cudaLaunchKernel``, ``cudaMemcpyAsync``,
  ``cuLaunchKernel`` ... on the launching CPU thread; ``args.correlation`` links each to the
  GPU activity it started.
- ``cat: "kernel"``: a GPU kernel (``args.correlation``, ``args.stream``, ``args.device``);
  NCCL's are named ``ncclDevKernel_AllGather_RING_LL(...)`` (NCCL >= 2.19) or
  ``ncclKernel_AllGather_RING_LL_Sum_int8_t(...)`` (older NCCL).
- ``cat: "gpu_memcpy"``: named ``Memcpy <HtoD|DtoH|DtoD|HtoH|PtoP> (<src> -> <dst>)`` where
  src/dst are CUPTI memory kinds (``Pageable``, ``Pinned``, ``Device``, ``Managed`` ...), with
  ``args.bytes``; ``cat: "gpu_memset"``: ``Memset (Device)``.
Times are microseconds (``ts``, ``dur``), CPU and GPU on one clock.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import json
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

STEP_MARK = "distperf:step"  # the record_function range around each profiled step


Interval = tuple[float, float]

LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
KERNEL_CAT = "kernel"
MEMCPY_CAT = "gpu_memcpy"
MEMSET_CAT = "gpu_memset"


def is_comm_kernel(name: str) -> bool:
    return name.startswith("nccl")


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a trace is read and analysed: its events (a dict each, hundreds
    of thousands on a large step) stay live throughout, and every collection the reading triggers would walk them
    all. They hold no reference cycles: reference counting frees them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def load(path: str, complete_only: bool = True) -> list[dict[str, Any]]:
    """The events of a Chrome trace file: the complete ('X') ones, or all of them."""
    with open(path) as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X"] if complete_only else events


def export(prof: Any, path: str | None = None, complete_only: bool = True) -> list[dict[str, Any]]:
    """The events (as `load`) of a finished torch.profiler's Chrome trace, written to `path` (kept) or to a
    temporary file (removed)."""
    keep = path is not None
    if path is None:
        fd, path = tempfile.mkstemp(prefix="distperf-trace-", suffix=".json")
        os.close(fd)
    try:
        prof.export_chrome_trace(path)
        return load(path, complete_only)
    finally:
        if not keep:
            os.remove(path)


@dataclass
class Trace:
    """The complete ('X') events of one rank's probe phase, indexed for the probes."""

    events: list[dict[str, Any]]
    steps: list[Interval] = field(init=False)  # the distperf:step ranges, in order
    step_threads: set[Any] = field(init=False)  # the CPU threads those ranges ran on
    launch_ts: dict[int, tuple[float, Any]] = field(init=False)  # correlation -> (launch ts, CPU thread)

    def __post_init__(self) -> None:
        marks = [e for e in self.events if e.get("cat") == "user_annotation" and e.get("name") == STEP_MARK]
        self.steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in marks)
        self.step_threads = {e.get("tid") for e in marks}
        self.launch_ts = {}
        for e in self.events:
            if e.get("cat") in LAUNCH_CATS:
                corr = (e.get("args") or {}).get("correlation")
                if corr:
                    self.launch_ts[corr] = (e["ts"], e.get("tid"))
        self._starts = [s for s, _ in self.steps]

    def check_launch_threads(self) -> None:
        """Refuse to attribute GPU work when launch calls and CPU ranges do not share thread ids: every kernel
        would look launched from elsewhere, and "no GPU kernels in optimizer.step()" would pass falsely."""
        if self.launch_ts and not any(tid in self.step_threads for _, tid in self.launch_ts.values()):
            raise RuntimeError(f"probe trace: no CUDA launch call ran on the thread of the {STEP_MARK} ranges "
                               f"(threads {sorted(map(str, self.step_threads))}); cannot attribute GPU work to CPU "
                               f"ranges")

    def of_cat(self, *cats: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("cat") in cats]

    def step_index(self, ts: float) -> int | None:
        """The profiled step whose range contains this CPU timestamp, or None."""
        i = bisect.bisect_right(self._starts, ts) - 1
        if i >= 0 and ts <= self.steps[i][1]:
            return i
        return None

    def gpu_step(self, e: dict[str, Any]) -> int | None:
        """The step a GPU activity belongs to: the step its launch call ran in, else the one its own start lies in
        (every profiled step ends with a device synchronisation inside its range)."""
        corr = (e.get("args") or {}).get("correlation")
        if corr in self.launch_ts:
            return self.step_index(self.launch_ts[corr][0])
        return self.step_index(e["ts"])

    def launched_within(self, e: dict[str, Any], start: float, end: float, tid: Any) -> bool:
        """Was this GPU activity launched from `tid` during [start, end]?"""
        launch = self.launch_ts.get((e.get("args") or {}).get("correlation"))
        return launch is not None and launch[1] == tid and start <= launch[0] <= end


def interval(e: dict[str, Any]) -> Interval:
    return (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))


def union(intervals: Iterable[Interval], gap: float = 0.0) -> list[Interval]:
    """Merge overlapping intervals into sorted, disjoint ones; gaps shorter than `gap` are closed too."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if e <= s:
            continue
        if out and s <= out[-1][1] + gap:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def length(intervals: Iterable[Interval]) -> float:
    return sum(e - s for s, e in union(intervals))


def intersection(a: Iterable[Interval], b: Iterable[Interval]) -> list[Interval]:
    """The sorted, disjoint intervals covered by both interval sets."""
    ua, ub = union(a), union(b)
    out: list[Interval] = []
    i = j = 0
    while i < len(ua) and j < len(ub):
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        if hi > lo:
            out.append((lo, hi))
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return out


def intersection_length(a: Iterable[Interval], b: Iterable[Interval]) -> float:
    """Total length covered by both interval sets."""
    return sum(e - s for s, e in intersection(a, b))
