"""What changed: the diff of two sides' operator/kernel tables (rank/time_table.py defines the rows).

Per row: the median over runs of its count and time per step on each side, the change in time and its share of its
family's change (below; the module: rows hold the op/kernel rows' time again, by module, so each family is shared on
its own). A run's table is trimmed to its slowest rows (rank/time_table.trimmed), so a small row may be missing from
some runs: a side's figures for a row come from its runs that kept it (a count is exact, so one kept run gives it; a
kept time is the upper part of that side's spread). A row in no run of the reference is "new", in no run of the
candidate "gone", unless a table of that side may have cut it (the row, wherever seen, within twice that table's
smallest kept row) or the other side holds it in no more than half its runs (a small row's self time that flickers
about the cut-off): then it is "cut", its absence says nothing and it never stands out. A row's noise is the larger
side's max - min of its time over the runs that give a figure for it (unknown with one a side): a rough,
deliberately wide band. A row stands out when |change| > noise and at least MATERIAL of the reference step's table,
or when its per-step counts do not overlap between the sides (counts are the same every step of an unchanged run; a
new or gone row's count changed). A family's summed rest, ``(other)``, names nothing: it never stands out and ranks
last.

The share (`rank`, the one definition): a row that stands out gets its change over the sum of the absolute changes
of the rows of its family that stand out (a flops: row's change is in FLOPs, its count; every other row's in
seconds); a row within its noise gets none. Rows within their noise are what an A/A shows, so letting them into the
sum would let noise that happens to cancel or to outweigh the real change give a grown row a negative share, or one
over 100 %; over the rows that stand out, the absolute shares of a family add up to 100 %, each in [0, 100 %],
signed by the row's direction (a replaced kernel: gone and new each a part of the same whole). Rows rank by that
share: every row that stands out before every row within its noise, then by the size of the change, which within a
family is the order of the shares (one sum) and across families, whose shares are of different sums (another clock),
compares seconds; a flops: row after the time rows of its tier. Before that, the rows of the clock a failed figure
reads come first (`explain_by`): under a failed gpu_time, a CUDA table's kernel rows before its host rows, whose
microseconds are another clock's; and where only counts failed, the rows whose count changed before those whose time
alone moved (a time that moved explains no count). The terminal, the JSON and HTML reports and the PR comment (its
top three rows that stand out) all read this one order.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

from pytest_distperf.rank.time_table import CPU, FLOPS, MODULE, OTHERS, family

SHOWN_ROWS = 5  # op/kernel/flops rows a failure message shows
SHOWN_MODULES = 2  # module: rows it shows besides, those that stand out: where the rows above ran
MATERIAL = 0.01  # a row whose time moved less than this share of the reference step's table never stands out
# The families a figure reads, where fewer than all (rank/time_table.family): gpu_time and kernels_per_step are the
# GPU rows (kernel:, collective:, copy:, the "" family of a CUDA table); aten_ops_per_step's operators are "" rows
# on CPU and cpu: rows on CUDA; flops_per_step is the flops: rows. step_time reads every clock: every family.
FIGURE_FAMILIES: dict[str, tuple[str, ...]] = {"gpu_time": ("",), "kernels_per_step": ("",),
                                               "aten_ops_per_step": ("", CPU), "flops_per_step": (FLOPS,)}


@dataclass
class ExplainRow:
    """One row of the diff: per step, medians over each side's runs."""

    name: str
    reference_count: float
    reference_time: float
    candidate_count: float
    candidate_time: float
    change: float  # candidate_time - reference_time
    noise: float | None  # None: a side has one run
    beyond_noise: bool
    share: float | None  # in [-1, 1] (`rank`); None: within its noise, or its family's rows that stand out moved 0
    status: str = ""  # "new", "gone", "cut" or ""
    count_changed: bool = False

    @property
    def stands_out(self) -> bool:
        return self.beyond_noise or self.count_changed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Explanation:
    """The diff of two sides' run tables (`explain`); `missing` says why there is none."""

    rows: list[ExplainRow]
    reference_runs: int
    candidate_runs: int
    missing: str = ""
    by: str = "time"  # how the rows are ranked (`rank`, `explain_by`)
    first: tuple[str, ...] = ()

    def shown(self, top: int, modules: int = SHOWN_MODULES) -> list[ExplainRow]:
        """The top rows of what ran (ops, kernels, collectives, FLOPs), then the module: rows that stand out: a
        module row sums its operators' time again, so it would outrank them in one list."""
        return ([r for r in self.rows if family(r.name) != MODULE and r.status != "cut"][:top]
                + [r for r in self.rows if family(r.name) == MODULE and r.stands_out][:modules if top else 0])

    @property
    def any_beyond_noise(self) -> bool:
        return any(r.stands_out for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"rows": [r.to_json() for r in self.rows], "reference_runs": self.reference_runs,
                "candidate_runs": self.candidate_runs, "missing": self.missing,
                "by": self.by, "first": list(self.first),
                "method": "medians over runs; noise: larger side's max-min over runs; ranks averaged; share: a "
                          "row's change over the summed absolute change of its family's rows that stand out"}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Explanation":
        """Read back, shared and ranked again by `rank` (a document written before the ranking was stored ranks
        every family alike, by time), so every reader reads the one ranking."""
        fields = set(ExplainRow.__dataclass_fields__)
        by, first = str(d.get("by") or "time"), tuple(d.get("first") or ())
        rows = [ExplainRow(**{k: v for k, v in r.items() if k in fields}) for r in d.get("rows") or []]
        return cls(rows=rank(rows, by, first), reference_runs=int(d.get("reference_runs") or 0),
                   candidate_runs=int(d.get("candidate_runs") or 0), missing=str(d.get("missing") or ""), by=by,
                   first=first)

    def lines(self, sides: tuple[str, str] = ("baseline", "current"), top: int = SHOWN_ROWS) -> list[str]:
        """The top rows in words, as the failure message and the terminal show them."""
        if self.missing:
            return [f"what changed: {self.missing}"]
        head = (f"what changed (per step, median of {self.reference_runs} {sides[0]} / {self.candidate_runs} "
                f"{sides[1]} runs, ranks averaged; noise: larger side's max-min over runs):")
        if not self.any_beyond_noise:
            head += " no row changed beyond its noise"
        out = [head]
        for r in self.shown(top):
            mark = ("noise unknown (one run a side)" if r.noise is None else
                    f"beyond its noise ({_ms(r.noise)})" if r.beyond_noise else
                    f"beyond its noise ({_ms(r.noise)}) but under {MATERIAL:.0%} of the step"
                    if abs(r.change) > r.noise and r.status != "cut" else f"within its noise ({_ms(r.noise)})")
            if r.count_changed:
                mark = f"count changed; time {mark}"
            share = _share(r)
            if r.name.startswith(FLOPS):  # a module's own FLOPs a step (exact): no time, no noise
                out.append(f"  {_label(r)}: {_flop(r.reference_count)} -> {_flop(r.candidate_count)} a step "
                           f"({_signed_flop(r.candidate_count - r.reference_count)}{share}; "
                           f"{'changed' if r.count_changed else 'unchanged'})")
                continue
            out.append(f"  {_label(r)}: {_count(r.reference_count)}x {_ms(r.reference_time)} -> "
                       f"{_count(r.candidate_count)}x {_ms(r.candidate_time)} ({_signed_ms(r.change)}{share}; "
                       f"{mark})")
        return out

    def headline(self, sides: tuple[str, str] = ("baseline", "current")) -> str:
        return self.lines(sides, top=0)[0]

    def header(self, sides: tuple[str, str] = ("baseline", "current")) -> list[str]:
        return ["row", f"{sides[0]} count", f"{sides[0]} time", f"{sides[1]} count", f"{sides[1]} time", "change",
                "share", "noise", "beyond noise"]

    def cells(self) -> list[list[str]]:
        """Every row as the HTML report's diff table shows it (`header`)."""
        def row(r: ExplainRow) -> list[str]:
            name = _label(r)
            if r.name.startswith(FLOPS):
                return [name, _flop(r.reference_count), "–", _flop(r.candidate_count), "–",
                        _signed_flop(r.candidate_count - r.reference_count),
                        "–" if r.share is None else f"{abs(r.share):.0%}", "exact",
                        "count" if r.count_changed else "no"]
            return [name, _count(r.reference_count), _ms(r.reference_time), _count(r.candidate_count),
                    _ms(r.candidate_time), _signed_ms(r.change), "–" if r.share is None else f"{abs(r.share):.0%}",
                    "unknown" if r.noise is None else _ms(r.noise),
                    "yes" if r.beyond_noise else "count" if r.count_changed else "no"]

        return [row(r) for r in self.rows]

    def contributions(self, top: int = SHOWN_ROWS) -> list[tuple[str, float, str]]:
        """The top rows that stand out as (name, change in seconds per step, one line): the HTML report's chart."""
        return [(_label(r), r.change,
                 f"{r.name}: {_signed_ms(r.change)}" + _share(r)
                 + f"; {_count(r.reference_count)} -> {_count(r.candidate_count)} a step")
                for r in self.shown(top) if r.stands_out and not r.name.startswith(FLOPS)]

    def short(self, top: int = 3) -> str:
        """The top rows that stand out in one line, as the PR comment lists them: the head of the one ranking."""
        if self.missing:
            return "nothing to explain (" + self.missing.split(" (")[0] + ")"
        shown = [r for r in self.shown(top, modules=1) if r.stands_out]
        if not shown:
            return "no row changed beyond its noise"

        def one(r: ExplainRow) -> str:
            notes = [r.status] if r.status else []
            if r.share is not None:
                notes.append(("shrank: " if r.share < 0 else "") + f"{abs(r.share):.0%} of {_whose(r)}")
            return (f"`{r.name}` " + (_signed_flop(r.candidate_count - r.reference_count)
                                     if r.name.startswith(FLOPS) else _signed_ms(r.change))
                    + (f" ({'; '.join(notes)})" if notes else ""))

        return "; ".join(one(r) for r in shown)


_WHOSE = {MODULE: "the modules' change", CPU: "the host rows' change", FLOPS: "the FLOPs' change"}


def _whose(r: ExplainRow) -> str:
    return _WHOSE.get(family(r.name), "the change")


def _share(r: ExplainRow) -> str:
    """`, 81% of the change beyond noise` (a row that grew), `, shrank: 76% of ...` (one that shrank), or nothing
    (a row within its noise: no share)."""
    if r.share is None:
        return ""
    beyond = "" if r.name.startswith(FLOPS) else " beyond noise"  # FLOPs are exact
    return f", {'shrank: ' if r.share < 0 else ''}{abs(r.share):.0%} of {_whose(r)}{beyond}"


def _label(r: ExplainRow) -> str:
    return r.name + (f" [{r.status}]" if r.status else "")


def _count(x: float) -> str:
    return f"{x:.0f}" if abs(x - round(x)) < 1e-6 else f"{x:.2f}"


def _flop(x: float) -> str:
    return f"{x:.4g} FLOP"


def _signed_flop(x: float) -> str:
    return f"{x:+.4g} FLOP"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _signed_ms(seconds: float) -> str:
    return ("+" if seconds >= 0 else "-") + _ms(abs(seconds))


def _spread(values: Sequence[float]) -> float | None:
    return max(values) - min(values) if len(values) > 1 else None


def explain(reference_runs: Sequence[Mapping[str, Sequence[float]] | None],
            candidate_runs: Sequence[Mapping[str, Sequence[float]] | None], by: str = "time",
            first: Sequence[str] = ()) -> Explanation:
    """The diff of two sides' run tables (module docstring); runs without a table are left out. `by`: "time" or
    "count"; `first`: the families whose rows rank first, none for all alike (both from `explain_by`)."""
    ref = [t for t in reference_runs if t is not None]
    cand = [t for t in candidate_runs if t is not None]
    if not ref or not cand:
        which = "the baseline" if not ref else "this run"
        return Explanation([], len(ref), len(cand),
                           missing=f"{which} holds no operator/kernel table (recorded before it existed, or no work "
                                   f"phase ran): nothing to explain")
    # A trimmed table (one with its family's summed rest, OTHERS) holds no row below that family's smallest kept one.
    def size(name: str, values: Sequence[float]) -> float:
        return float(values[0] if name.startswith(FLOPS) else values[1])

    def smallest_kept(t: Mapping[str, Sequence[float]], fam: str) -> float:
        kept = [size(n, v) for n, v in t.items() if n != OTHERS[fam] and family(n) == fam]
        return min(kept, default=0.0) if OTHERS[fam] in t else 0.0

    cut = {(id(t), fam): smallest_kept(t, fam) for t in ref + cand for fam in OTHERS}
    step = statistics.median(sum(v[1] for n, v in t.items() if family(n) == "") for t in ref)
    rows: list[ExplainRow] = []
    for name in sorted(set().union(*ref, *cand)):
        fam = family(name)
        held = [[t for t in side if name in t] for side in (ref, cand)]
        least = min(size(name, t[name]) for h in held for t in h)
        # A side's figures come from its tables that hold the row (a count is exact, so one kept run gives it; a
        # kept time is the upper part of that side's spread); a side that holds it nowhere ran it not at all, unless
        # one of its tables may have cut it.
        status = ""
        if not held[0] or not held[1]:
            absent, present = (ref, held[1]) if not held[0] else (cand, held[0])
            side_size = len(cand if absent is ref else ref)
            status = ("cut" if any(least <= 2 * cut[(id(t), fam)] for t in absent) or 2 * len(present) <= side_size
                      else "new" if absent is ref else "gone")
        rc, rt, cc, ct = ([float(t[name][i]) for t in h] or [0.0] * len(side)
                          for h, side in zip(held, (ref, cand)) for i in (0, 1))
        spreads = [_spread(rt), _spread(ct)]
        noise = None if None in spreads else max(s for s in spreads if s is not None)
        change = statistics.median(ct) - statistics.median(rt)
        rest = name in OTHERS.values()  # a family's summed rest names nothing: it explains nothing
        count_changed = status != "cut" and not rest and (max(rc) < min(cc) or max(cc) < min(rc))
        rows.append(ExplainRow(name=name, reference_count=statistics.median(rc), reference_time=statistics.median(rt),
                               candidate_count=statistics.median(cc), candidate_time=statistics.median(ct),
                               change=change, noise=noise,
                               beyond_noise=(status != "cut" and not rest and noise is not None
                                             and abs(change) > noise and abs(change) >= MATERIAL * step),
                               share=None, status=status, count_changed=count_changed))
    return Explanation(rank(rows, by, first), len(ref), len(cand), by=by, first=tuple(first))


def _measured(r: ExplainRow) -> float:
    """What a row's share is of: a flops: row's change in FLOPs (its count, exact), every other row's in seconds."""
    return r.candidate_count - r.reference_count if r.name.startswith(FLOPS) else r.change


def rank(rows: Sequence[ExplainRow], by: str = "time", first: Sequence[str] = ()) -> list[ExplainRow]:
    """The rows with their shares set, in the one order every reader shows (module docstring): `by` "count" (only
    counts failed) puts the rows whose count changed first among those that stand out; `first`, the families the
    failed figures read."""
    totals: dict[str, float] = {}
    for r in rows:
        if r.stands_out:
            totals[family(r.name)] = totals.get(family(r.name), 0.0) + abs(_measured(r))
    for r in rows:
        total = totals.get(family(r.name), 0.0)
        r.share = _measured(r) / total if r.stands_out and total else None

    def key(r: ExplainRow) -> tuple:
        return (r.name in OTHERS.values(), not r.stands_out, bool(first) and family(r.name) not in first,
                by == "count" and not r.count_changed, r.name.startswith(FLOPS), -abs(_measured(r)), r.name)

    return sorted(rows, key=key)


def explain_by(failed: Sequence[tuple[str, str]]) -> tuple[str, tuple[str, ...]]:
    """How to rank an explanation under these failed (figure, kind) verdicts: by count where only counts failed,
    else by time; first, the families the failed figures of that kind read (FIGURE_FAMILIES; none: every family
    alike, as when step_time or nothing failed)."""
    by = "count" if failed and all(kind == "count" for _, kind in failed) else "time"
    read = [FIGURE_FAMILIES.get(name) for name, kind in failed if kind == by]
    if not read or any(f is None for f in read):
        return by, ()
    return by, tuple(sorted({x for f in read if f for x in f}))
