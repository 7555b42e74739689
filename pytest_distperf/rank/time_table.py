"""Where a step's time goes, by operator or kernel: the rows of the work phase's table (figures/explain.py
diffs two sides' tables).

Built from the events of the work phase's profiler pass (rank/work.py): no extra pass, nothing added to the
timed steps.

- ``kernel:<name>`` (CUDA only): GPU kernels, by name normalised so one kernel is one row (`kernel_name`: template
  argument lists ``<...>``, parameter lists ``(...)``, a trailing launch-config or ``[clone]`` suffix dropped).
  Count and GPU time (the kernels' summed duration) per step. Stripping template arguments merges what they
  tell apart (PyTorch's elementwise kernels carry their functor there): such a row says which kernel family
  moved. A kernel belongs to the step its launch call ran in (trace.gpu_step). Communication kernels (NCCL,
  trace.is_comm_kernel) are ``collective:<name>`` rows; memcpy/memset are ``copy:<Memcpy HtoD>``-style rows
  (gpu_time counts them).
- ``op:<aten op name>`` (CPU only): operator events (cat "cpu_op") on any thread, inside a step's range. Count and
  SELF host time per step: events are nested per thread by ts/dur (`self_times`), and a parent's time is its
  duration less its direct children's (record_function ranges take part in the nesting, so an op inside
  ``Optimizer.step`` is not counted in the range, and the range itself is no row). The step's own self time,
  what its host spends outside every operator and range (Python, a host-side loop), is the row
  ``host:(outside operators)``. Operators named ``c10d::...`` and ranges named ``gloo:...`` are
  ``collective:<name>`` rows (their time includes waiting for the peers).
  Nesting trusts the profiler's timestamps: a child that sticks out of its parent by rounding is clamped, so a
  self time is never below zero.

On CUDA the table holds the GPU rows (what gpu_time sums), on CPU the op rows (host time): one clock per family.
A CUDA table adds the host side as a family of its own (`family`), as its clock is not the GPU rows': the op and
collective rows as on CPU, named ``cpu:<op name>`` (an operator's count a step is what aten_ops_per_step counts;
one that launches no kernel, as a collective on one rank, is seen only here), and ``cpu:(outside operators and CUDA
calls)``, the step's own host time outside every operator, range and CUDA runtime call (Python, a host-side loop),
the figure that decides a host-bound step.

- ``module:<module path>``: which ``nn.Module`` that time ran under, forward and backward: the work phase's
  profiler pass puts a range around every module's forward (`module_ranges`, global hooks, so a script's model is
  reached too). A forward operator belongs to the innermost module range around it; a backward operator to the
  module of the forward operator whose autograd node it evaluates (the profiler's sequence numbers link the two,
  as PyTorch's profiler views link forward and backward); a kernel to the module its launch call ran under. The
  time is the CPU rows' self time (CPU) or the GPU rows' time (CUDA) the module ran itself, what its children's
  rows do not hold; the count is the module's forward calls a step. Names as the flops: rows (repeated blocks
  folded); the TOP_MODULES rows with the most time kept, the rest in MODULE_TIME_OTHER. Time outside every module
  (the loss, the optimizer step) is in no module row. The ranges' own host cost (a few microseconds a module call)
  is in ``host:(outside operators)``, on both sides of a diff alike.

- ``flops:<module path>``: which ``nn.Module`` the step's FLOPs ran under, forward and backward (the work phase's
  counting pass: FlopCounterMode attributes each operator's FLOPs to the modules active around it). A row holds
  the module's own FLOPs per step, what its children's rows do not (so the rows add up to the step's FLOPs), in
  the count column, and no time; the outermost index of repeated blocks folds into ``*`` (``layers.*.mlp``: every
  layer's MLP summed; an index inside a block, a Sequential's, stays), and the root keeps its class name. Exact,
  so measured in the first run of each test's runs of a job only (rank/work.py `counts`) and given to its other
  runs' tables (store/baselines.explain_tables).

Per run: each row's count and time averaged over the profiled steps, then the mean over the ranks (a rank
without the row did not run it: 0 there; ranks keep every row, so none is cut on one rank only). Then the TOP_ROWS
rows with the most time are kept, the rest summed into one ``(other)`` row, so a stored baseline stays small; a
row that fell into ``(other)`` in some run is missing there (figures/explain.py reads such a row from the runs
that kept it).
"""

from __future__ import annotations

import contextlib
import functools
import re
import weakref
from typing import Any, Iterable, Iterator, Mapping, Sequence

from pytest_distperf.rank.probes.trace import (KERNEL_CAT, LAUNCH_CATS, MEMCPY_CAT, MEMSET_CAT, STEP_MARK,
                                               is_comm_kernel)

TOP_ROWS = 30  # rows kept per run table, besides (other)
TOP_MODULES = 20  # flops: rows kept, besides MODULES_OTHER
OTHER = "(other)"
MODULES_OTHER = "flops:(other modules)"
HOST_ROW = "host:(outside operators)"
CPU = "cpu:"
CUDA_HOST_ROW = "cpu:(outside operators and CUDA calls)"
FLOPS = "flops:"
MODULE = "module:"
MODULE_TIME_OTHER = "module:(other modules)"
MODULE_MARK = "distperf.module:"  # the profiler range around a module's forward (`module_ranges`)
BACKWARD_MARK = "autograd::engine::evaluate_function:"
OTHERS = {"": OTHER, FLOPS: MODULES_OTHER, MODULE: MODULE_TIME_OTHER, CPU: "cpu:(other)"}  # each family's rest

# A table: row name -> [count per step, seconds per step]. Plain JSON: it crosses the process boundary and is
# stored in a baseline as it is.
Table = dict[str, list[float]]


# -- rows -------------------------------------------------------------------------------------------------------
def _strip_nested(name: str, open_: str, close: str) -> str:
    """`name` without any (nested) `open_ ... close` group."""
    out, depth = [], 0
    for ch in name:
        if ch == open_:
            depth += 1
        elif ch == close and depth:
            depth -= 1
        elif not depth:
            out.append(ch)
    return "".join(out)


@functools.lru_cache(maxsize=None)  # a step launches the same few hundred kernels thousands of times
def kernel_name(name: str) -> str:
    """One name per kernel: template arguments and parameter lists dropped, `void` and a return type before the
    qualified name dropped, a `[clone]`/launch suffix dropped."""
    n = name.replace("(anonymous namespace)", "anon")
    n = _strip_nested(n, "<", ">")
    n = _strip_nested(n, "(", ")")
    n = re.sub(r"\[[^\]]*\]", "", n)  # "[clone .kd]" and similar
    n = n.strip()
    n = n.split()[-1] if n else name  # "void at::native::foo" -> "at::native::foo"
    return n or name


def is_collective_op(name: str) -> bool:
    """A CPU-side collective: c10d's operators and gloo's ranges."""
    return name.startswith(("c10d::", "gloo:"))


def self_times(events: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], float]]:
    """Each event with its self time (its duration less its direct children's, same thread), in microseconds."""
    out: list[tuple[Mapping[str, Any], float]] = []
    for spans in _by_thread(events).values():
        selfs = [dur for _, dur, _, _ in spans]
        stack: list[tuple[int, float]] = []  # (index, end) of the open parents
        for i, (ts, _, end, _) in enumerate(spans):
            while stack and stack[-1][1] <= ts:
                stack.pop()
            if stack:
                parent, parent_end = stack[-1]
                selfs[parent] -= max(0.0, min(end, parent_end) - ts)  # clamped: a child sticking out by rounding
            stack.append((i, end))
        out += [(e, max(0.0, s)) for (_, _, _, e), s in zip(spans, selfs)]
    return out


def _by_thread(events: Iterable[Mapping[str, Any]]) -> dict[Any, list[tuple[float, float, float, Any]]]:
    """Per thread, (ts, dur, end, event) in start order, a parent before its children (the longer first)."""
    by_tid: dict[Any, list[tuple[float, float, float, Any]]] = {}
    for e in events:
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        by_tid.setdefault(e.get("tid"), []).append((ts, dur, ts + dur, e))
    for spans in by_tid.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
    return by_tid


def family(name: str) -> str:
    """The family a row belongs to: "" (the op/kernel rows, one clock), FLOPS, MODULE or CPU (a CUDA table's host
    row). Each family is trimmed, summed and diffed on its own (its rows partition the step's figure)."""
    return next((f for f in (FLOPS, MODULE, CPU) if name.startswith(f)), "")


def _add(table: Table, row: str, seconds: float, count: float = 1) -> None:
    entry = table.setdefault(row, [0.0, 0.0])
    entry[0] += count
    entry[1] += seconds


def _nested(trace: Any) -> list[Mapping[str, Any]]:
    """The operators and ranges that nest for self time: every one but the module ranges."""
    return [e for e in trace.events if e.get("cat") == "cpu_op" or (
        e.get("cat") == "user_annotation" and not str(e.get("name", "")).startswith(MODULE_MARK))]


def cpu_rows(trace: Any) -> Table:
    """Op rows of a trace (rank/probes/trace.Trace), summed over its steps: [count, seconds]."""
    table: Table = {}
    for e, self_us in self_times(_nested(trace)):
        name = str(e.get("name", ""))
        if trace.step_index(float(e["ts"])) is None:
            continue
        if name == STEP_MARK:  # the step's own host time outside every operator and range: Python, the host's loops
            _add(table, HOST_ROW, self_us * 1e-6)
        elif is_collective_op(name):
            _add(table, f"collective:{name}", self_us * 1e-6)
        elif e.get("cat") == "cpu_op":
            _add(table, f"op:{name}", self_us * 1e-6)
    return table


def cuda_host_rows(trace: Any) -> Table:
    """A CUDA trace's host rows: the op and collective rows as on CPU, as ``cpu:`` rows, and the step ranges' self
    time with CUDA runtime calls nested among the operators (CUDA_HOST_ROW)."""
    table = {CPU + name.removeprefix("op:"): v for name, v in cpu_rows(trace).items() if name != HOST_ROW}
    nested = _nested(trace) + [e for e in trace.events if e.get("cat") in LAUNCH_CATS]
    seconds = sum(self_us for e, self_us in self_times(nested) if e.get("name") == STEP_MARK) * 1e-6
    return {**table, CUDA_HOST_ROW: [float(len(trace.steps)), seconds]} if trace.steps else table


def gpu_rows(trace: Any) -> Table:
    """Kernel, collective and copy rows of a trace, summed over its steps: [count, seconds]."""
    table: Table = {}
    for e in trace.of_cat(KERNEL_CAT, MEMCPY_CAT, MEMSET_CAT):
        if trace.gpu_step(e) is None:
            continue
        name = str(e.get("name", ""))
        if e.get("cat") != KERNEL_CAT:
            row = f"copy:{name.split(' (')[0]}"  # "Memcpy HtoD (Pageable -> Device)" -> "Memcpy HtoD"
        elif is_comm_kernel(name):
            row = f"collective:{kernel_name(name)}"
        else:
            row = f"kernel:{kernel_name(name)}"
        _add(table, row, float(e.get("dur", 0.0)) * 1e-6)
    return table


@contextlib.contextmanager
def module_ranges() -> Iterator[None]:
    """A profiler range named MODULE_MARK + path around every nn.Module's forward while inside: the root by its
    class name, the rest by their attribute path under it (as FlopCounterMode's ModuleTracker names them)."""
    import torch
    from torch.autograd.profiler import record_function

    names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    open_ranges: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def enter(module: Any, _args: Any) -> None:
        if module not in names:  # a root: its whole tree named at once (a ModuleList's blocks never enter it)
            root = type(module).__name__
            for path, sub in module.named_modules():
                names.setdefault(sub, f"{root}.{path}" if path else root)
        rf = record_function(MODULE_MARK + names[module])
        rf.__enter__()
        open_ranges.setdefault(module, []).append(rf)

    def leave(module: Any, _args: Any, _out: Any) -> None:
        ranges = open_ranges.get(module)
        if ranges:
            ranges.pop().__exit__(None, None, None)

    pre = torch.nn.modules.module.register_module_forward_pre_hook(enter)
    post = torch.nn.modules.module.register_module_forward_hook(leave)
    try:
        yield
    finally:
        pre.remove()
        post.remove()


def _sweep(events: Iterable[Mapping[str, Any]], visit: Any) -> None:
    """Per thread, in start order, `visit(event, module)` with the innermost enclosing context's module; what
    `visit` returns other than False becomes the context of the events inside this one (None: no module)."""
    for spans in _by_thread(events).values():
        stack: list[tuple[float, str | None]] = []
        for ts, _, end, e in spans:
            while stack and stack[-1][0] <= ts:
                stack.pop()
            pushed = visit(e, stack[-1][1] if stack else None)
            if pushed is not False:
                stack.append((end, pushed))


def module_time_rows(trace: Any, cuda: bool) -> Table:
    """The module: rows of a trace, summed over its steps: [forward calls, seconds] (module docstring)."""
    events = [e for e in trace.events if e.get("cat") in ("cpu_op", "user_annotation", *LAUNCH_CATS)]
    table: Table = {}
    forward: dict[Any, str] = {}  # sequence number -> the module its forward operator ran in

    def seq(e: Mapping[str, Any]) -> Any:
        return (e.get("args") or {}).get("Sequence number")

    def first(e: Mapping[str, Any], module: str | None) -> str | None | bool:
        name = str(e.get("name", ""))
        if name.startswith(MODULE_MARK):
            path = name[len(MODULE_MARK):]
            if trace.step_index(float(e["ts"])) is not None:
                _add(table, path, 0.0)
            return path
        if module is not None and seq(e) is not None and not (e.get("args") or {}).get("Fwd thread id"):
            forward.setdefault(seq(e), module)
        return False

    _sweep(events, first)
    own = {} if cuda else {id(e): self_us for e, self_us in self_times(_nested(trace))}  # CPU: ops' self time
    launched: dict[Any, str] = {}  # correlation -> the module its launch ran in

    def second(e: Mapping[str, Any], module: str | None) -> str | None | bool:
        name = str(e.get("name", ""))
        if name.startswith(MODULE_MARK):
            return name[len(MODULE_MARK):]
        if name.startswith(BACKWARD_MARK):
            module = forward.get(seq(e))
        if module is not None and trace.step_index(float(e["ts"])) is not None:
            if e.get("cat") in LAUNCH_CATS:
                launched[(e.get("args") or {}).get("correlation")] = module
            elif not cuda and e.get("cat") == "cpu_op" and not is_collective_op(name):
                _add(table, module, own.get(id(e), 0.0) * 1e-6, 0)
        return module if name.startswith(BACKWARD_MARK) else False

    _sweep(events, second)
    if cuda:
        for e in trace.of_cat(KERNEL_CAT, MEMCPY_CAT, MEMSET_CAT):
            module = launched.get((e.get("args") or {}).get("correlation"))
            if module is not None and trace.gpu_step(e) is not None:
                _add(table, module, float(e.get("dur", 0.0)) * 1e-6, 0)
    out: Table = {}
    for path, (calls, seconds) in table.items():
        _add(out, MODULE + fold(path), seconds, calls)
    return {n: v for n, v in out.items() if v[1] > 0}  # a container whose work is all in its children: no row


def fold(name: str) -> str:
    """A module's row name: its path under the root (the root by its class name), the outermost index of repeated
    blocks as ``*`` (``layers.*.mlp``: every layer's MLP; an index inside a block, a Sequential's, stays)."""
    parts = (name.partition(".")[2] or name).split(".")
    first = next((i for i, part in enumerate(parts) if part.isdigit()), None)
    if first is not None:
        parts[first] = "*"
    return ".".join(parts)


def module_rows(flop_counts: Mapping[str, Mapping[Any, int]], steps: int) -> Table:
    """The flops: rows from FlopCounterMode.get_flop_counts() over `steps` steps: each module's own FLOPs a step,
    repeated blocks folded; the top TOP_MODULES kept, the rest summed into MODULES_OTHER."""
    totals = {name: sum(ops.values()) for name, ops in flop_counts.items() if name != "Global"}

    def parent(name: str) -> str | None:  # the nearest enclosing module that ran (a ModuleList never runs)
        while "." in name:
            name = name.rpartition(".")[0]
            if name in totals:
                return name
        return None

    own: dict[str, float] = {}
    for name, total in totals.items():
        children = sum(t for child, t in totals.items() if parent(child) == name)
        folded = FLOPS + fold(name)
        own[folded] = own.get(folded, 0.0) + (total - children) / max(1, steps)
    ranked = sorted((n for n, v in own.items() if v > 0), key=lambda n: (-own[n], n))
    out = {n: [_round(own[n]), 0.0] for n in ranked[:TOP_MODULES]}
    if ranked[TOP_MODULES:]:
        out[MODULES_OTHER] = [_round(sum(own[n] for n in ranked[TOP_MODULES:])), 0.0]
    return out


def rank_table(trace: Any, cuda: bool) -> Table:
    """One rank's table: its rows per step (averaged over the trace's steps), every row: a run's table trims the
    mean over its ranks (`run_table`), so a row one rank kept and another cut never averages in a 0."""
    steps = max(1, len(trace.steps))
    rows = {**({**gpu_rows(trace), **cuda_host_rows(trace)} if cuda else cpu_rows(trace)),
            **module_time_rows(trace, cuda)}
    return {name: [_round(c / steps), _round(t / steps)] for name, (c, t) in rows.items()}


def trimmed(table: Mapping[str, Sequence[float]], top: int = TOP_ROWS) -> Table:
    """The op/kernel rows: the `top` with the most time kept, the rest summed into OTHER; the module: rows
    likewise (TOP_MODULES, MODULE_TIME_OTHER), and a CUDA table's cpu: rows (`top`, the host row always kept);
    numbers rounded to 4 significant digits. The flops: rows pass as they are (module_rows trims them by FLOPs)."""
    out: Table = {}
    for fam, keep in (("", top), (MODULE, TOP_MODULES), (CPU, top)):
        other = OTHERS[fam]
        ranked = sorted((n for n in table if n != other and family(n) == fam),
                        key=lambda n: (n != CUDA_HOST_ROW, -table[n][1], n))
        out.update({n: [_round(table[n][0]), _round(table[n][1])] for n in ranked[:keep]})
        rest = ranked[keep:] + ([other] if other in table else [])
        if rest:
            out[other] = [_round(sum(table[n][0] for n in rest)), _round(sum(table[n][1] for n in rest))]
    out.update({n: [_round(v[0]), 0.0] for n, v in table.items() if family(n) == FLOPS})
    return out


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def run_table(rank_tables: Sequence[Mapping[str, Sequence[float]] | None]) -> Table | None:
    """A run's table: per row the mean over its ranks (a rank without the row did not run it: 0 there), then
    trimmed; None when a rank has no table (a run measured before the table existed, or without a work phase)."""
    if not rank_tables or any(t is None for t in rank_tables):
        return None
    n = len(rank_tables)
    names = set().union(*(t.keys() for t in rank_tables if t is not None))
    mean = {name: [sum(t.get(name, (0.0, 0.0))[i] for t in rank_tables if t is not None) / n for i in (0, 1)]
            for name in names}
    return trimmed(mean)
