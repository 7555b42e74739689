"""Where the work runs: copies, the optimizer step's CPU/GPU split, optimizer-state devices.

- Copies (CUDA): CUPTI memcpy records in the Chrome trace, ``Memcpy HtoD (Pinned -> Device)``,
  ``Memcpy DtoH (Device -> Pageable)``, ...; direction from the first word, pageable when either
  side is ``Pageable`` (a pageable copy is staged by the driver and blocks the host).
- Optimizer step: torch.optim wraps every optimizer's ``step()`` (DeepSpeedCPUAdam included)
  in a ``record_function`` named ``Optimizer.step#<Class>.step``. Its host duration is the
  CPU time; on CUDA, the kernels and copies *launched from inside it* (runtime calls on the
  same thread within the range, linked to GPU records by ``correlation``) are its GPU work.
- Optimizer state: the devices of the state tensors and of the (master) parameters the torch
  optimizer updates, read from the optimizer object inside the rank.
- CPU utilisation: process CPU time over wall time, measured in the runner on un-profiled
  steps (the profiler's own bookkeeping would count as CPU work).
"""

from __future__ import annotations

import re
from typing import Any

from pytest_distperf.rank.probes.results import CopyStats, OptimizerStepStats
from pytest_distperf.rank.probes.trace import KERNEL_CAT, MEMCPY_CAT, MEMSET_CAT, Trace

OPTIMIZER_RANGE = re.compile(r"^Optimizer\.step#(.+)\.step$")
_MEMCPY = re.compile(r"^Memcpy (\w+) \((.+?) -> (.+?)\)")


def memcpy_kind(name: str) -> tuple[str, bool] | None:
    """('HtoD', pageable?) for a CUPTI memcpy record name, None for anything else."""
    m = _MEMCPY.match(name)
    if not m:
        return None
    return m.group(1), "Pageable" in (m.group(2), m.group(3))


def copies(trace: Trace) -> dict[str, CopyStats]:
    steps = len(trace.steps)
    out: dict[str, CopyStats] = {}
    for e in trace.of_cat(MEMCPY_CAT):
        parsed = memcpy_kind(e.get("name", ""))
        step = trace.gpu_step(e)
        if parsed is None or step is None:
            continue
        kind, pageable = parsed
        c = out.setdefault(kind, CopyStats(kind, [0] * steps, [0] * steps, [0] * steps, [0] * steps))
        nbytes = int((e.get("args") or {}).get("bytes", 0))
        c.counts[step] += 1
        c.bytes[step] += nbytes
        if pageable:
            c.pageable_counts[step] += 1
            c.pageable_bytes[step] += nbytes
    return out


def optimizer_steps(trace: Trace, cuda: bool) -> dict[str, OptimizerStepStats]:
    steps = len(trace.steps)
    out: dict[str, OptimizerStepStats] = {}
    gpu = trace.of_cat(KERNEL_CAT, MEMCPY_CAT, MEMSET_CAT) if cuda else []
    if cuda:
        trace.check_launch_threads()
    for r in trace.of_cat("user_annotation"):
        m = OPTIMIZER_RANGE.match(r.get("name", ""))
        step = trace.step_index(r["ts"]) if m else None
        if m is None or step is None:
            continue
        s = out.get(m.group(1))
        if s is None:
            s = out[m.group(1)] = OptimizerStepStats(m.group(1), [0] * steps, [0.0] * steps)
            if cuda:
                s.gpu_kernels, s.gpu_kernel_seconds, s.gpu_copies = [0] * steps, [0.0] * steps, [0] * steps
        s.calls[step] += 1
        s.cpu_seconds[step] += r["dur"] * 1e-6
        for g in gpu:
            if not trace.launched_within(g, r["ts"], r["ts"] + r["dur"], r.get("tid")):
                continue
            if g.get("cat") == KERNEL_CAT:
                s.gpu_kernels[step] += 1  # type: ignore[index]
                s.gpu_kernel_seconds[step] += g.get("dur", 0.0) * 1e-6  # type: ignore[index]
            else:
                s.gpu_copies[step] += 1  # type: ignore[index]
    return out


def optimizer_state(optimizer: Any) -> tuple[dict[str, int], dict[str, int]]:
    """(bytes, tensor count) by device type of the optimizer's state and the params it updates."""
    bytes_by: dict[str, int] = {}
    count_by: dict[str, int] = {}

    def add(t: Any) -> None:
        local = t.to_local() if hasattr(t, "to_local") else t  # FSDP2 DTensor: this rank's shard
        dev = local.device.type
        bytes_by[dev] = bytes_by.get(dev, 0) + local.numel() * local.element_size()
        count_by[dev] = count_by.get(dev, 0) + 1

    # DeepSpeed ZeRO-3 keeps its fp32 partitions only as keys of `state` between steps.
    params = [p for g in optimizer.param_groups for p in g["params"]] + list(optimizer.state.keys())
    seen: set[int] = set()
    for p in params:
        if hasattr(p, "numel") and id(p) not in seen:
            seen.add(id(p))
            add(p)
    for state in optimizer.state.values():
        for v in state.values():
            if hasattr(v, "numel") and v.dim() > 0:
                add(v)
    return bytes_by, count_by
