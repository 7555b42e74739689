"""Collectives per step and per kind: count, bytes, message sizes. Works on gloo and NCCL.

What torch.profiler records (tests/test_probes.py counts the gloo events exactly):
- every ``torch.distributed`` collective, DDP's reducer included, is a c10d dispatcher op (``c10d::allgather_``,
  ...) recorded as a ``cpu_op`` on the calling thread; functional collectives (DTensor, compiled code) are
  ``_c10d_functional::*`` ops, which on gloo nest a c10d op;
- gloo's own ``gloo:*`` ranges are not one per call (it runs reduce_scatter as all_reduce): not counted;
- NCCL runs one GPU kernel per collective or coalesced group (``ncclDevKernel_AllGather_RING_LL``;
  ``ncclKernel_*`` before NCCL 2.19), with the op's ``Collective name``, ``dtype`` and message element counts.

How we count:
- gloo (CPU): one collective = one outermost c10d / functional op of the profiler's event tree, in the
  ``distperf:step`` range holding its start.
- NCCL (CUDA): one collective = one NCCL kernel of the Chrome trace, in the step its launch call ran in
  (``Trace.gpu_step``). Not the c10d ops: those issued from autograd's device thread (FSDP2's and ZeRO-3's
  backward) can be missing from the CPU-side record; the kernels are all there.

Message size (bytes) follows nccl-tests: the full buffer the collective covers. From a kernel: the larger of its
element counts times the dtype's size. From a c10d op whose arguments show only the shard side (list-form
``allgather_``, ``reduce_scatter_``, ``gather_``, ``scatter_``): shard x the job's world size (every strategy here
uses one data-parallel group). A kernel without size arguments counts, its size unknown
(``CollectiveStats.unsized``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from pytest_distperf.rank.probes.results import NCCL_SOURCE, OPS_SOURCE, CollectiveStats, CommsResult
from pytest_distperf.rank.probes.trace import KERNEL_CAT, STEP_MARK, Trace

# An op's argument list -> message bytes, given the group size. `a[i]` is the byte count of
# argument i (a tensor or a tensor list; None where the profiler kept no tensors).
Rule = Callable[[list[int | None], list[Any], int], int]


def _arg(i: int) -> Rule:
    return lambda a, raw, g: a[i] or 0


def _arg_times_group(i: int) -> Rule:
    return lambda a, raw, g: (a[i] or 0) * g


def _arg_times_int(i: int, j: int) -> Rule:
    # functional all_gather(input, group_size, group_name): the group size is an argument
    return lambda a, raw, g: (a[i] or 0) * (raw[j] if isinstance(raw[j], int) else g)


def _zero(a: list[int | None], raw: list[Any], g: int) -> int:
    return 0


# op name -> (kind, message-size rule). Argument orders are the c10d op schemas of torch 2.13.
COLLECTIVE_OPS: dict[str, tuple[str, Rule]] = {
    "c10d::allgather_": ("all_gather", _arg_times_group(1)),  # (Tensor[][] out, Tensor[] in, pg, ...)
    "c10d::_allgather_base_": ("all_gather", _arg(0)),  # (Tensor out, Tensor in, pg, ...)
    "c10d::allgather_coalesced_": ("all_gather", _arg_times_group(1)),
    "c10d::allgather_into_tensor_coalesced_": ("all_gather", _arg(0)),  # (Tensor[] out, Tensor[] in, pg)
    "c10d::allreduce_": ("all_reduce", _arg(0)),
    "c10d::allreduce_coalesced_": ("all_reduce", _arg(0)),
    "c10d::reduce_scatter_": ("reduce_scatter", _arg_times_group(0)),  # (Tensor[] out, Tensor[][] in, ...)
    "c10d::_reduce_scatter_base_": ("reduce_scatter", _arg(1)),  # (Tensor out, Tensor in, ...)
    "c10d::reduce_scatter_tensor_coalesced_": ("reduce_scatter", _arg(1)),
    "c10d::broadcast_": ("broadcast", _arg(0)),
    "c10d::reduce_": ("reduce", _arg(0)),
    "c10d::gather_": ("gather", _arg_times_group(1)),
    "c10d::scatter_": ("scatter", _arg_times_group(0)),
    "c10d::alltoall_": ("all_to_all", _arg(1)),
    "c10d::alltoall_base_": ("all_to_all", _arg(1)),
    "c10d::send": ("send", _arg(0)),
    "c10d::recv_": ("recv", _arg(0)),
    "c10d::recv_any_source_": ("recv", _arg(0)),
    "c10d::barrier": ("barrier", _zero),
    "c10d::monitored_barrier_": ("barrier", _zero),
    "_c10d_functional::all_gather_into_tensor": ("all_gather", _arg_times_int(0, 1)),
    "_c10d_functional::all_gather_into_tensor_out": ("all_gather", _arg_times_int(0, 1)),
    "_c10d_functional::all_gather_into_tensor_coalesced": ("all_gather", _arg_times_int(0, 1)),
    "_c10d_functional::reduce_scatter_tensor": ("reduce_scatter", _arg(0)),
    "_c10d_functional::reduce_scatter_tensor_out": ("reduce_scatter", _arg(0)),
    "_c10d_functional::reduce_scatter_tensor_coalesced": ("reduce_scatter", _arg(0)),
    "_c10d_functional::all_reduce": ("all_reduce", _arg(0)),
    "_c10d_functional::all_reduce_": ("all_reduce", _arg(0)),
    "_c10d_functional::all_reduce_coalesced": ("all_reduce", _arg(0)),
    "_c10d_functional::all_reduce_coalesced_": ("all_reduce", _arg(0)),
    "_c10d_functional::broadcast": ("broadcast", _arg(0)),
    "_c10d_functional::broadcast_": ("broadcast", _arg(0)),
    "_c10d_functional::all_to_all_single": ("all_to_all", _arg(0)),
    "_c10d_functional::isend": ("send", _arg(0)),
    "_c10d_functional::irecv": ("recv", _arg(0)),
    "_c10d_functional_autograd::all_gather_into_tensor": ("all_gather", _arg_times_int(0, 1)),
    "_c10d_functional_autograd::reduce_scatter_tensor": ("reduce_scatter", _arg(0)),
    "_c10d_functional_autograd::all_to_all_single": ("all_to_all", _arg(0)),
}

# NCCL kernel name -> collective kind: ncclDevKernel_AllGather_RING_LL(...), ncclKernel_AllReduce_...
_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_NCCL_KINDS = {"AllGather": "all_gather", "ReduceScatter": "reduce_scatter", "AllReduce": "all_reduce",
               "Broadcast": "broadcast", "Reduce": "reduce", "SendRecv": "send_recv", "AllToAll": "all_to_all"}


@dataclass
class CollectiveCall:
    op: str
    kind: str
    start_ns: int
    size: int | None  # message bytes (see the module docstring); None where the record has no sizes
    dtype: str | None


# c10 ScalarType names, as Kineto writes a kernel's "dtype" argument -> bytes per element
SCALAR_TYPE_BYTES = {
    "Bool": 1, "Byte": 1, "Char": 1, "QInt8": 1, "QUInt8": 1, "Float8_e5m2": 1, "Float8_e4m3fn": 1,
    "Float8_e5m2fnuz": 1, "Float8_e4m3fnuz": 1, "Short": 2, "Half": 2, "BFloat16": 2, "UInt16": 2,
    "Int": 4, "Float": 4, "QInt32": 4, "UInt32": 4, "ComplexHalf": 4, "Long": 8, "Double": 8, "UInt64": 8,
    "ComplexFloat": 8, "ComplexDouble": 16,
}


def _tensor_bytes(meta: Any) -> int:
    return math.prod(meta.sizes) * meta.dtype.itemsize


def _arg_bytes(arg: Any) -> int | None:
    """Bytes of a tensor argument or a flat tensor list; None where the profiler kept none."""
    if hasattr(arg, "sizes") and hasattr(arg, "dtype"):
        return _tensor_bytes(arg)
    if isinstance(arg, list) and arg and all(hasattr(t, "sizes") for t in arg):
        return sum(_tensor_bytes(t) for t in arg)
    return None


def _first_dtype(args: list[Any]) -> str | None:
    for a in args:
        for t in (a if isinstance(a, list) else [a]):
            if hasattr(t, "dtype") and hasattr(t, "sizes"):
                return str(t.dtype).replace("torch.", "")
    return None


def walk(roots: list[Any]) -> Any:
    """Every operator / record_function event (TorchOp) of the profiler's event tree, depth first: not Kineto's
    GPU-side copies of ranges, which must not count twice."""
    stack = list(reversed(roots))
    while stack:
        e = stack.pop()
        if str(e.tag).endswith("TorchOp"):
            yield e
        stack.extend(reversed(e.children))


def _inside_collective(e: Any) -> bool:
    p = e.parent
    while p is not None:
        if p.name in COLLECTIVE_OPS:
            return True
        p = p.parent
    return False


def step_windows(roots: list[Any]) -> list[tuple[int, int]]:
    """The (start, end) ns of every distperf:step range in the event tree, in order."""
    return sorted((e.start_time_ns, e.end_time_ns) for e in walk(roots) if e.name == STEP_MARK)


def collective_calls(roots: list[Any], group_size: int) -> list[CollectiveCall]:
    """Every outermost collective op in the event tree, with its message size."""
    calls = []
    for e in walk(roots):
        if e.name not in COLLECTIVE_OPS or _inside_collective(e):
            continue
        kind, rule = COLLECTIVE_OPS[e.name]
        raw = list(getattr(e.extra_fields, "inputs", None) or [])
        sizes = [_arg_bytes(a) for a in raw] + [None] * 4  # schemas with trailing defaults
        size = rule(sizes, raw + [None] * 4, group_size)
        calls.append(CollectiveCall(op=e.name, kind=kind, start_ns=e.start_time_ns, size=size, dtype=_first_dtype(raw)))
    return calls


def in_windows(calls: list[CollectiveCall], windows: list[tuple[int, int]]) -> list[tuple[int, CollectiveCall]]:
    """(step, call) for each call whose start lies in a step window (calls outside are dropped)."""
    out = []
    for c in calls:
        step = next((i for i, (s, e) in enumerate(windows) if s <= c.start_ns <= e), None)
        if step is not None:
            out.append((step, c))
    return out


def summarize(calls: list[tuple[int, CollectiveCall]], steps: int, group_size: int, source: str) -> CommsResult:
    """Group (step, call) pairs by kind and step."""
    by_kind: dict[str, CollectiveStats] = {}
    for step, c in sorted(calls, key=lambda sc: sc[1].start_ns):
        st = by_kind.setdefault(c.kind, CollectiveStats(c.kind, [0] * steps, [0] * steps, []))
        st.counts[step] += 1
        if c.size is None:
            st.unsized += 1
        else:
            st.bytes[step] += c.size
            st.sizes.append(c.size)
        st.ops[c.op] = st.ops.get(c.op, 0) + 1
        if c.dtype:
            st.dtypes[c.dtype] = st.dtypes.get(c.dtype, 0) + 1
    return CommsResult(steps=steps, by_kind=by_kind, group_size=group_size, source=source)


def nccl_kernel_kind(name: str) -> str | None:
    m = _NCCL_KERNEL.match(name)
    if not m:
        return None
    return _NCCL_KINDS.get(m.group(1), m.group(1))


def _kernel_size(args: dict[str, Any]) -> int | None:
    """nccl-tests bytes from Kineto's arguments of an NCCL kernel, or None where they are missing."""
    nelems = [args.get("In msg nelems"), args.get("Out msg nelems")]
    itemsize = SCALAR_TYPE_BYTES.get(str(args.get("dtype")))
    if itemsize is None or not any(isinstance(n, int) for n in nelems):
        return None
    return max(n for n in nelems if isinstance(n, int)) * itemsize


def kernel_calls(trace: Trace) -> list[tuple[int, CollectiveCall]]:
    """(step, call) for every NCCL kernel launched inside a profiled step (CUDA)."""
    out = []
    for e in trace.of_cat(KERNEL_CAT):
        name = e.get("name", "")
        kind = nccl_kernel_kind(name)
        step = trace.gpu_step(e) if kind else None
        if kind is None or step is None:
            continue
        args = e.get("args") or {}
        dtype = args.get("dtype")
        out.append((step, CollectiveCall(op=str(args.get("Collective name") or name.split("(")[0]), kind=kind,
                                         start_ns=int(float(e["ts"]) * 1000), size=_kernel_size(args),
                                         dtype=str(dtype) if dtype else None)))
    return out


def measure(roots: list[Any], group_size: int, trace: Trace | None) -> CommsResult:
    """The comms probe: NCCL kernels from the trace on CUDA, c10d ops from the event tree on gloo."""
    if trace is not None:
        return summarize(kernel_calls(trace), len(trace.steps), group_size, source=NCCL_SOURCE)
    windows = step_windows(roots)
    return summarize(in_windows(collective_calls(roots, group_size), windows), len(windows), group_size,
                     source=OPS_SOURCE)
