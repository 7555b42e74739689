"""Communication/compute overlap on the GPU timeline (CUDA only), from the Chrome trace.

Communication = NCCL kernels (``ncclDevKernel_*`` / ``ncclKernel_*``); compute = every other
kernel (memcpy and memset records are not kernels and count as neither). Per step:

- comm time: length of the union of NCCL kernel intervals;
- overlapped: the part of it during which at least one compute kernel runs, on any stream;
- exposed: comm time - overlapped, i.e. communication nothing hides.

An NCCL kernel's interval includes time spent waiting for the peer ranks, so "exposed" also
holds load imbalance; this is the usual reading of a trace (HTA does the same).
"""

from __future__ import annotations

from pytest_distperf.rank.probes.results import OverlapResult
from pytest_distperf.rank.probes.trace import KERNEL_CAT, Interval, Trace, interval, intersection_length, is_comm_kernel
from pytest_distperf.rank.probes.trace import length as union_length


def overlap_of(comm: list[Interval], compute: list[Interval]) -> tuple[float, float, float]:
    """(comm time, overlapped time, compute time) of one step, in the intervals' unit."""
    return union_length(comm), intersection_length(comm, compute), union_length(compute)


def measure(trace: Trace) -> OverlapResult:
    steps = len(trace.steps)
    comm: list[list[Interval]] = [[] for _ in range(steps)]
    compute: list[list[Interval]] = [[] for _ in range(steps)]
    kernels = [0] * steps
    for e in trace.of_cat(KERNEL_CAT):
        step = trace.gpu_step(e)
        if step is None:
            continue
        if is_comm_kernel(e.get("name", "")):
            comm[step].append(interval(e))
            kernels[step] += 1
        else:
            compute[step].append(interval(e))
    us = [overlap_of(c, k) for c, k in zip(comm, compute)]
    return OverlapResult(steps=steps, comm_seconds=[c * 1e-6 for c, _, _ in us],
                         overlapped_seconds=[o * 1e-6 for _, o, _ in us],
                         compute_seconds=[k * 1e-6 for _, _, k in us], comm_kernels=kernels)
