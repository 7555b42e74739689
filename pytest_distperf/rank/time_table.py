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

On CUDA the table holds the GPU rows (what gpu_time sums), on CPU the op rows (host time): one clock per table.

- ``flops:<module path>``: which ``nn.Module`` the step's FLOPs ran under, forward and backward (the work phase's
  counting pass: FlopCounterMode attributes each operator's FLOPs to the modules active around it). A row holds
  the module's own FLOPs per step, what its children's rows do not (so the rows add up to the step's FLOPs), in
  the count column, and no time; the outermost index of repeated blocks folds into ``*`` (``layers.*.mlp``: every
  layer's MLP summed; an index inside a block, a Sequential's, stays), and the root keeps its class name. Exact,
  so measured in a job's first run of a session only (rank/work.py `counts`) and given to its other runs'
  tables (store/baselines.explain_tables).

Per run: each row's count and time averaged over the profiled steps, then the mean over the ranks (a rank
without the row counts 0). The TOP_ROWS rows with the most time are kept, the rest summed into one ``(other)``
row, so a stored baseline stays small; a row that fell into ``(other)`` in some run reads 0 there.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

from pytest_distperf.rank.probes.trace import KERNEL_CAT, MEMCPY_CAT, MEMSET_CAT, STEP_MARK, is_comm_kernel

TOP_ROWS = 30  # rows kept per run table, besides (other)
TOP_MODULES = 20  # flops: rows kept, besides MODULES_OTHER
OTHER = "(other)"
MODULES_OTHER = "flops:(other modules)"
HOST_ROW = "host:(outside operators)"
FLOPS = "flops:"

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
    by_tid: dict[Any, list[Mapping[str, Any]]] = {}
    for e in events:
        by_tid.setdefault(e.get("tid"), []).append(e)
    out: list[tuple[Mapping[str, Any], float]] = []
    for evs in by_tid.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e.get("dur", 0.0))))  # a parent before its children
        selfs = [float(e.get("dur", 0.0)) for e in evs]
        stack: list[int] = []
        for i, e in enumerate(evs):
            ts = float(e["ts"])
            while stack and float(evs[stack[-1]]["ts"]) + float(evs[stack[-1]].get("dur", 0.0)) <= ts:
                stack.pop()
            if stack:
                parent = evs[stack[-1]]
                end = min(ts + float(e.get("dur", 0.0)), float(parent["ts"]) + float(parent.get("dur", 0.0)))
                selfs[stack[-1]] -= max(0.0, end - ts)  # clamped: a child sticking out by rounding
            stack.append(i)
        out += [(e, max(0.0, s)) for e, s in zip(evs, selfs)]
    return out


def _add(table: Table, row: str, seconds: float) -> None:
    entry = table.setdefault(row, [0.0, 0.0])
    entry[0] += 1
    entry[1] += seconds


def cpu_rows(trace: Any) -> Table:
    """Op rows of a trace (rank/probes/trace.Trace), summed over its steps: [count, seconds]."""
    table: Table = {}
    nested = [e for e in trace.events if e.get("cat") in ("cpu_op", "user_annotation")]
    for e, self_us in self_times(nested):
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
        path = name.partition(".")[2] or name  # the root by its class name, the rest by their path under it
        parts = path.split(".")
        first = next((i for i, part in enumerate(parts) if part.isdigit()), None)
        if first is not None:  # the repeated blocks: the outermost index; an index inside a block stays
            parts[first] = "*"
        folded = f"{FLOPS}{'.'.join(parts)}"
        own[folded] = own.get(folded, 0.0) + (total - children) / max(1, steps)
    ranked = sorted((n for n, v in own.items() if v > 0), key=lambda n: (-own[n], n))
    out = {n: [_round(own[n]), 0.0] for n in ranked[:TOP_MODULES]}
    if ranked[TOP_MODULES:]:
        out[MODULES_OTHER] = [_round(sum(own[n] for n in ranked[TOP_MODULES:])), 0.0]
    return out


def rank_table(trace: Any, cuda: bool) -> Table:
    """One rank's table: its rows per step (averaged over the trace's steps), the top TOP_ROWS kept."""
    steps = max(1, len(trace.steps))
    rows = gpu_rows(trace) if cuda else cpu_rows(trace)
    return trimmed({name: [c / steps, t / steps] for name, (c, t) in rows.items()})


def trimmed(table: Mapping[str, Sequence[float]], top: int = TOP_ROWS) -> Table:
    """The `top` rows with the most time, the rest summed into OTHER; numbers rounded to 4 significant digits.
    The flops: rows pass as they are (module_rows trims them by FLOPs)."""
    ranked = sorted((n for n in table if n != OTHER and not n.startswith(FLOPS)), key=lambda n: (-table[n][1], n))
    out = {n: [_round(table[n][0]), _round(table[n][1])] for n in ranked[:top]}
    rest = ranked[top:] + ([OTHER] if OTHER in table else [])
    if rest:
        out[OTHER] = [_round(sum(table[n][0] for n in rest)), _round(sum(table[n][1] for n in rest))]
    out.update({n: [_round(v[0]), 0.0] for n, v in table.items() if n.startswith(FLOPS)})
    return out


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def run_table(rank_tables: Sequence[Mapping[str, Sequence[float]] | None]) -> Table | None:
    """A run's table: per row the mean over its ranks (a rank without the row counts 0); None when a rank has
    no table (a run measured before the table existed, or without a work phase)."""
    if not rank_tables or any(t is None for t in rank_tables):
        return None
    n = len(rank_tables)
    names = set().union(*(t.keys() for t in rank_tables if t is not None))
    mean = {name: [sum(t.get(name, (0.0, 0.0))[i] for t in rank_tables if t is not None) / n for i in (0, 1)]
            for name in names}
    return trimmed(mean)
