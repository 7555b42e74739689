"""Where a step's time goes, by operator or kernel: the rows of the work phase's table (figures/explain.py
diffs two sides' tables).

Built from the events of the work phase's profiler pass (rank/work.py): no extra pass, nothing added to the
timed steps.

- ``kernel:<name>`` (CUDA only): GPU kernels, by name normalised so one kernel is one row (`kernel_name`: template
  argument lists ``<...>``, parameter lists ``(...)``, a trailing launch-config or ``[clone]`` suffix dropped).
  Count and GPU time (the kernels' summed duration) per step. Stripping template arguments merges what they
  tell apart (PyTorch's elementwise kernels carry their functor there): such a row says which kernel family
  moved. A kernel belongs to the step its launch call ran in (trace.gpu_step). Communication kernels (NCCL, trace.is_comm_kernel) are ``collective:<name>`` rows;
  memcpy/memset are ``copy:<Memcpy HtoD>``-style rows (gpu_time counts them).
- ``op:<aten op name>`` (CPU only): operator events (cat "cpu_op") on any thread, inside a step's range. Count and
  SELF host time per step: events are nested per thread by ts/dur (`self_times`), and a parent's time is its
  duration less its direct children's (record_function ranges take part in the nesting, so an op inside
  ``Optimizer.step`` is not counted in the range, and the range itself is no row). The step's own self time,
  what its host spends outside every operator and range (Python, a host-side loop), is the row
  ``host:(outside operators)``. Operators named ``c10d::...``
  and ranges named ``gloo:...`` are ``collective:<name>`` rows (their time includes waiting for the peers).
  Nesting trusts the profiler's timestamps: a child that sticks out of its parent by rounding is clamped, so a
  self time is never below zero.

On CUDA the table holds the GPU rows (what gpu_time sums), on CPU the op rows (host time): one clock per table.

Per run: each row's count and time averaged over the profiled steps, then the mean over the ranks (a rank
without the row counts 0). The TOP_ROWS rows with the most time are kept, the rest summed into one ``(other)``
row, so a stored baseline stays small; a row that fell into ``(other)`` in some run reads 0 there.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Mapping, Sequence

from pytest_distperf.rank.probes.trace import KERNEL_CAT, MEMCPY_CAT, MEMSET_CAT, STEP_MARK, is_comm_kernel

TOP_ROWS = 30  # rows kept per run table, besides (other)
OTHER = "(other)"
HOST_ROW = "host:(outside operators)"

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


def rank_table(trace: Any, cuda: bool) -> Table:
    """One rank's table: its rows per step (averaged over the trace's steps), the top TOP_ROWS kept."""
    steps = max(1, len(trace.steps))
    rows = gpu_rows(trace) if cuda else cpu_rows(trace)
    return trimmed({name: [c / steps, t / steps] for name, (c, t) in rows.items()})


def trimmed(table: Mapping[str, Sequence[float]], top: int = TOP_ROWS) -> Table:
    """The `top` rows with the most time, the rest summed into OTHER; numbers rounded to 4 significant digits."""
    ranked = sorted((n for n in table if n != OTHER), key=lambda n: (-table[n][1], n))
    out = {n: [_round(table[n][0]), _round(table[n][1])] for n in ranked[:top]}
    rest = ranked[top:] + ([OTHER] if OTHER in table else [])
    if rest:
        out[OTHER] = [_round(sum(table[n][0] for n in rest)), _round(sum(table[n][1] for n in rest))]
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
