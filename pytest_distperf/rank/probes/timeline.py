"""One profiled step of one rank, read from its probe trace: when compute and when communication ran.

Computed in the probe phase (recorder.py) from the trace it holds, so the report draws it from the JSON
document without opening a trace file. No torch here: the pytest process reads these records back.
"""

from __future__ import annotations

from pytest_distperf.rank.probes.comms import COLLECTIVE_OPS
from pytest_distperf.rank.probes.results import StepTimeline
from pytest_distperf.rank.probes.trace import (KERNEL_CAT, STEP_MARK, Interval, Trace, interval, is_comm_kernel,
                                               union)

GPU_SOURCE = "GPU kernels"
CPU_SOURCE = "CPU ops"
RESOLUTION = 700  # gaps shorter than 1/700 of the step are closed: a chart 900 px wide cannot show them


def _is_comm_name(name: str) -> bool:
    return name.startswith(("gloo:", "nccl:", "nccl")) or name in COLLECTIVE_OPS


def step_timeline(trace: Trace, rank: int) -> StepTimeline:
    """The middle profiled step of a probe trace. On CUDA the lanes are GPU kernels (NCCL vs the rest, as the
    overlap probe reads them); on CPU they are the profiler's ops: the collectives' own ranges (gloo runs them
    on its worker threads) against the ops of the thread that runs the step."""
    if not trace.steps:
        raise ValueError(f"no '{STEP_MARK}' range in the probe trace")
    step = len(trace.steps) // 2
    start, end = trace.steps[step]
    kernels = [e for e in trace.of_cat(KERNEL_CAT) if trace.gpu_step(e) == step]
    if trace.of_cat(KERNEL_CAT):
        source = GPU_SOURCE
        compute = [interval(e) for e in kernels if not is_comm_kernel(e.get("name", ""))]
        comm = [(*interval(e), e["name"].split("(")[0]) for e in kernels if is_comm_kernel(e.get("name", ""))]
        start = min([start, *(s for s, _ in compute), *(s for s, _, _ in comm)])
        end = max([end, *(f for _, f in compute), *(f for _, f, _ in comm)])
    else:
        source = CPU_SOURCE
        compute, comm = _cpu_lanes(trace, start, end)
    gap = (end - start) / RESOLUTION
    return StepTimeline(rank=rank, source=source, step=step, steps=len(trace.steps), length=end - start,
                        compute=[(s - start, e - start) for s, e in union(compute, gap)],
                        comm=[(s - start, e - start, n) for s, e, n in sorted(comm)])


def _cpu_lanes(trace: Trace, start: float, end: float) -> tuple[list[Interval], list[tuple[float, float, str]]]:
    """(compute, communication) of the CPU step in [start, end]."""
    inside = [e for e in trace.events
              if start <= float(e["ts"]) <= end and e.get("cat") in ("cpu_op", "user_annotation")]
    comm_events = [e for e in inside if _is_comm_name(e.get("name", ""))]
    # gloo's ranges on its worker threads are the transfers; the c10d op on the step's thread is the call that
    # issues them (and waits, when the collective is synchronous).
    worker = [e for e in comm_events if e.get("name", "").startswith("gloo:")]
    comm = [(*interval(e), e["name"]) for e in worker or comm_events]
    issued = [interval(e) for e in comm_events if e.get("tid") in trace.step_threads]
    compute = []
    for e in inside:
        if e.get("cat") != "cpu_op" or e.get("tid") not in trace.step_threads or _is_comm_name(e.get("name", "")):
            continue
        s, f = interval(e)
        if not any(s <= a and b <= f for a, b in issued):  # an op around a collective call is not compute
            compute.append((s, f))
    return compute, comm
