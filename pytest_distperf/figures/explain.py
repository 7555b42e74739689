"""What changed: a per-run table of where a step's time goes, by operator or kernel, and the diff of two sides'.

Rows (built in the ranks from the events of the work phase's profiler pass, rank/work.py; no extra pass and
nothing added to the timed steps):

- ``kernel:<name>`` (CUDA only): GPU kernels, by name normalised so one kernel is one row (`kernel_name`: template
  argument lists ``<...>``, parameter lists ``(...)``, a trailing launch-config or ``[clone]`` suffix dropped).
  Count and GPU time (the kernels' summed duration) per step. Stripping template arguments merges what they
  tell apart (PyTorch's elementwise kernels carry their functor there): such a row says which kernel family moved. A kernel belongs to the step its launch call ran
  in (trace.gpu_step). Communication kernels (NCCL, trace.is_comm_kernel) are ``collective:<name>`` rows;
  memcpy/memset are ``copy:<Memcpy HtoD>``-style rows (gpu_time counts them).
- ``op:<aten op name>`` (CPU only): operator events (cat "cpu_op") on any thread, inside a step's range. Count and
  SELF host time per step: events are nested per thread by ts/dur (`self_times`), and a parent's time is its
  duration less its direct children's (record_function ranges take part in the nesting, so an op inside
  ``Optimizer.step`` is not counted in the range, and the range itself is no row). Operators named ``c10d::...``
  and ranges named ``gloo:...`` are ``collective:<name>`` rows (their time includes waiting for the peers).
  Nesting trusts the profiler's timestamps: a child that sticks out of its parent by rounding is clamped, so a
  self time is never below zero.

On CUDA the table holds the GPU rows (what gpu_time sums), on CPU the op rows (host time): one clock per table.

Per run: each row's count and time averaged over the profiled steps, then the mean over the ranks (a rank
without the row counts 0). The TOP_ROWS rows with the most time are kept, the rest summed into one ``(other)``
row, so a stored baseline stays small; a row that fell into ``(other)`` in some run reads 0 there.

The diff (`explain`): per row, the median over runs of its count and time per step on each side, the change in
time (candidate - reference), the row's own run-to-run noise and whether the change stands out of it, and its
share of the summed change (the net change of the whole table: a share can pass 100 % when rows moved in
opposite directions). Noise: the larger of the two sides' spread of the row's time across runs (max - min over
the runs); with one run on a side that side's spread is unknown, and so is the noise: nothing is then said to
stand out. A change stands out when |change| > noise. Rows present in no reference run are "new", in no
candidate run "gone". Min - max of a few runs is a rough, deliberately wide band: a row outside it moved more
than the runs of either side did among themselves. Rows sort by |change|.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Sequence

from pytest_distperf.rank.probes.trace import KERNEL_CAT, MEMCPY_CAT, MEMSET_CAT, STEP_MARK, is_comm_kernel

TOP_ROWS = 30  # rows kept per run table, besides (other)
OTHER = "(other)"
SHOWN_ROWS = 5  # rows a failure message shows

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
        if trace.step_index(float(e["ts"])) is None or name == STEP_MARK:
            continue
        if is_collective_op(name):
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


# -- the diff ---------------------------------------------------------------------------------------------------
@dataclass
class ExplainRow:
    """One row of the diff; times in seconds per step, counts per step (medians over each side's runs)."""

    name: str
    reference_count: float
    reference_time: float
    candidate_count: float
    candidate_time: float
    change: float  # candidate_time - reference_time
    noise: float | None  # the larger side's max - min of the row's time over its runs; None: a side has one run
    beyond_noise: bool  # |change| > noise (never when the noise is unknown)
    share: float | None  # change / the summed change of all rows; None when that is 0
    status: str = ""  # "new" (in no reference run), "gone" (in no candidate run) or ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Explanation:
    """The diff of two sides' run tables (`explain`), rows sorted by |change|; `missing` says why there is none."""

    rows: list[ExplainRow]
    reference_runs: int
    candidate_runs: int
    missing: str = ""

    @property
    def any_beyond_noise(self) -> bool:
        return any(r.beyond_noise for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"rows": [r.to_json() for r in self.rows], "reference_runs": self.reference_runs,
                "candidate_runs": self.candidate_runs, "missing": self.missing,
                "method": "medians over runs; noise: larger side's max-min over runs; ranks averaged"}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Explanation":
        fields = set(ExplainRow.__dataclass_fields__)
        return cls(rows=[ExplainRow(**{k: v for k, v in r.items() if k in fields}) for r in d.get("rows") or []],
                   reference_runs=int(d.get("reference_runs") or 0),
                   candidate_runs=int(d.get("candidate_runs") or 0), missing=str(d.get("missing") or ""))

    def lines(self, sides: tuple[str, str] = ("baseline", "current"), top: int = SHOWN_ROWS) -> list[str]:
        """The top rows in words, as the failure message and the terminal show them."""
        if self.missing:
            return [f"what changed: {self.missing}"]
        head = (f"what changed (per step, median of {self.reference_runs} {sides[0]} / {self.candidate_runs} "
                f"{sides[1]} runs, ranks averaged; noise: larger side's max-min over runs):")
        if not self.any_beyond_noise:
            head += " no row changed beyond its noise"
        out = [head]
        for r in self.rows[:top]:
            mark = ("noise unknown (one run a side)" if r.noise is None else
                    f"{'beyond' if r.beyond_noise else 'within'} its noise ({_ms(r.noise)})")
            share = f", {r.share:.0%} of the change" if r.share is not None else ""
            status = f" [{r.status}]" if r.status else ""
            out.append(f"  {r.name}{status}: {_count(r.reference_count)}x {_ms(r.reference_time)} -> "
                       f"{_count(r.candidate_count)}x {_ms(r.candidate_time)} ({_signed_ms(r.change)}{share}; "
                       f"{mark})")
        return out


    def headline(self, sides: tuple[str, str] = ("baseline", "current")) -> str:
        """The first of `lines`: what the diff is over, or why there is none."""
        return self.lines(sides, top=0)[0]

    def header(self, sides: tuple[str, str] = ("baseline", "current")) -> list[str]:
        return ["row", f"{sides[0]} count", f"{sides[0]} time", f"{sides[1]} count", f"{sides[1]} time", "change",
                "share", "noise", "beyond noise"]

    def cells(self) -> list[list[str]]:
        """Every row as the HTML report's diff table shows it (`header`)."""
        return [[r.name + (f" [{r.status}]" if r.status else ""), _count(r.reference_count), _ms(r.reference_time),
                 _count(r.candidate_count), _ms(r.candidate_time), _signed_ms(r.change),
                 "–" if r.share is None else f"{r.share:.0%}", "unknown" if r.noise is None else _ms(r.noise),
                 "yes" if r.beyond_noise else "no"] for r in self.rows]

    def short(self, top: int = 3) -> str:
        """The top rows in one line, as the PR comment lists them."""
        if self.missing:
            return "nothing to explain (" + self.missing.split(" (")[0] + ")"
        return "; ".join(f"`{r.name}` {_signed_ms(r.change)}" + (f" ({r.status})" if r.status else "")
                         + ("" if r.beyond_noise else " within noise") for r in self.rows[:top])


def _count(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 1e-6 else f"{x:.2f}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _signed_ms(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + _ms(abs(seconds))


def _spread(values: Sequence[float]) -> float | None:
    return max(values) - min(values) if len(values) > 1 else None


def explain(reference_runs: Sequence[Mapping[str, Sequence[float]] | None],
            candidate_runs: Sequence[Mapping[str, Sequence[float]] | None]) -> Explanation:
    """The diff of two sides' run tables (module docstring). Runs without a table are left out; a side with none
    explains nothing and says so."""
    ref = [t for t in reference_runs if t is not None]
    cand = [t for t in candidate_runs if t is not None]
    if not ref or not cand:
        which = "the baseline" if not ref else "this run"
        return Explanation([], len(ref), len(cand),
                           missing=f"{which} holds no operator/kernel table (recorded before it existed, or no work "
                                   f"phase ran): nothing to explain")
    rows: list[ExplainRow] = []
    for name in sorted(set().union(*ref, *cand)):
        rc = [float(t[name][0]) if name in t else 0.0 for t in ref]
        rt = [float(t[name][1]) if name in t else 0.0 for t in ref]
        cc = [float(t[name][0]) if name in t else 0.0 for t in cand]
        ct = [float(t[name][1]) if name in t else 0.0 for t in cand]
        spreads = [_spread(rt), _spread(ct)]
        noise = None if None in spreads else max(s for s in spreads if s is not None)
        change = statistics.median(ct) - statistics.median(rt)
        status = ("new" if not any(name in t for t in ref) else "gone" if not any(name in t for t in cand) else "")
        rows.append(ExplainRow(name=name, reference_count=statistics.median(rc), reference_time=statistics.median(rt),
                               candidate_count=statistics.median(cc), candidate_time=statistics.median(ct),
                               change=change, noise=noise, beyond_noise=noise is not None and abs(change) > noise,
                               share=None, status=status))
    total = sum(r.change for r in rows)
    for r in rows:
        r.share = r.change / total if total else None
    rows.sort(key=lambda r: (-abs(r.change), r.name))
    return Explanation(rows, len(ref), len(cand))
