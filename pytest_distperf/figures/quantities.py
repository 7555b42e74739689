"""One definition of each reported quantity of a run and a job: every table, check, gate and report reads these.

A run's step time is the median over its timed steps of the slowest rank's step time (collectives make every rank
wait for it); a job's is the geometric mean of its runs', so a ratio of two jobs is exactly the ratio the checks
and the gate decide on. Memory, work figures and counts follow the same rule: per run the worst rank, per job the
geometric mean of a time and the largest run of a count. The memory figure decided on is CUDA peak allocated on
CUDA and the training state (`train_memory`) on CPU, where host RSS growth also counts imports and one-time
allocations and is only shown beside it (`secondary_memory_metric`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence

from pytest_distperf.figures.stats import quantile, relative_spread
from pytest_distperf.figures.units import fmt_seconds
from pytest_distperf.rank.breakdown import ALL_KEYS, PHASES, median_step

if TYPE_CHECKING:
    from pytest_distperf.rank.results import RunResult

HOST_BOUND_BELOW = 0.5  # GPU busy share under which a step is host-bound

# What each quantity is, for the reports' legends: (unit, scope).
SCOPES: dict[str, tuple[str, str]] = {
    "step_time": ("s", "slowest rank per step; median of a run's steps; geometric mean of the runs"),
    "run_cv": ("log sd", "run-to-run: sd of the log run step times"),
    "pair_cv": ("log sd", "pair-to-pair: sd of the log ratios of interleaved pairs"),
    "peak_memory": ("bytes", "highest rank (CUDA peak allocated; CPU: host RSS growth, secondary: train_memory "
                             "decides memory on CPU); geometric mean of the runs"),
    "comms": ("calls, bytes", "per step, per rank (the rank with the most)"),
    "optimizer_state_bytes": ("bytes", "summed over ranks"),
    "gpu_time": ("s", "compute kernels + memcpy/memset per step, the busiest rank; geometric mean of the runs"),
    "gpu_busy_share": ("share", "GPU busy time (union over streams) / step time"),
    "kernels_per_step": ("kernels", "per step, the rank with the most"),
    "flops_per_step": ("FLOP", "per step, the rank with the most (torch.utils.flop_counter)"),
    "aten_ops_per_step": ("ops", "operators dispatched per step, the rank with the most"),
    "instructions_per_step": ("instructions", "user space, the rank's main thread; the rank with the most"),
    "train_memory": ("bytes", "CPU: parameters, gradients, optimizer state + a step's allocation peak; highest rank"),
}
# Work figures (rank/work.py): name -> (the WorkResult field, "time" | "count").
WORK_METRICS: dict[str, tuple[str, str]] = {
    "gpu_time": ("gpu_time", "time"),
    "instructions_per_step": ("instructions", "time"),
    "kernels_per_step": ("kernels", "count"),
    "flops_per_step": ("flops", "count"),
    "aten_ops_per_step": ("aten_ops", "count"),
}

# The figures a job is gated and tracked on: name -> (unit, direction, kind); kind picks the decision rule.
KNOWN_METRICS: dict[str, tuple[str, str, str]] = {
    "step_time": ("s", "lower", "time"),
    "peak_memory": ("bytes", "lower", "memory"),
    "optimizer_state_bytes": ("bytes", "lower", "count"),
    "gpu_time": ("s", "lower", "time"),
    "instructions_per_step": ("instructions", "lower", "time"),
    "kernels_per_step": ("kernels", "lower", "count"),
    "flops_per_step": ("FLOP", "lower", "count"),
    "aten_ops_per_step": ("ops", "lower", "count"),
    "train_memory": ("bytes", "lower", "memory"),
}


def metric_traits(name: str) -> tuple[str, str, str]:
    """(unit, direction, kind) of a metric name."""
    if name in KNOWN_METRICS:
        return KNOWN_METRICS[name]
    if name.startswith("comms."):
        return ("bytes" if name.endswith(".bytes_per_step") else "calls", "lower", "count")
    return ("count", "lower", "count")


def geometric_mean(values: Sequence[float]) -> float:
    """exp(mean(log v)); a value of 0 (a zero RSS growth) counts as a tiny positive one, so a ratio stays finite."""
    if not values:
        raise ValueError("geometric mean of no values")
    return math.exp(math.fsum(math.log(max(v, 1e-300)) for v in values) / len(values))


def step_time_of(step_times: Sequence[float]) -> float:
    """The step time of a run (its steps, each the slowest rank's) or of one rank (its own steps): the median."""
    return quantile(step_times, 0.5)


def run_step_time(run: "RunResult") -> float:
    return step_time_of(run.step_times)


def run_peak_memory(run: "RunResult") -> float:
    """At least 1 byte, so ratios stay finite (a zero RSS growth)."""
    return float(max(run.peak_memory, 1))


def run_work(run: "RunResult") -> dict[str, float]:
    """The run's work figures measured on every rank, by metric name; `train_memory` on CPU."""
    works = [r.work for r in run.ranks]
    if not works or any(w is None for w in works):
        return {}
    out: dict[str, float] = {}
    for name, (attr, kind) in WORK_METRICS.items():
        values = [getattr(w, attr) for w in works]
        if all(values):
            out[name] = float(max(quantile(v, 0.5) if kind == "time" else max(v) for v in values))
    if all(w.state_bytes is not None and w.step_peak_bytes for w in works):
        out["train_memory"] = float(max(w.state_bytes + max(w.step_peak_bytes) for w in works))
    return out


def run_gpu_busy(run: "RunResult") -> float | None:
    """The busiest rank's median GPU busy time per step (s); None when not measured."""
    busy = [r.work.gpu_busy for r in run.ranks if r.work is not None and r.work.gpu_busy]
    return max(quantile(b, 0.5) for b in busy) if busy and len(busy) == len(run.ranks) else None


def node_step_medians(run: "RunResult") -> dict[str, float]:
    """Median step time of each node's ranks ("node 1 (gpu-07)"): a straggler node stands out. Empty on one node."""
    nodes: dict[tuple[int, str], list[float]] = {}
    for r in run.ranks:
        nodes.setdefault((r.node_rank, r.host or ""), []).extend(r.step_times)
    if len(nodes) < 2:
        return {}
    return {f"node {n} ({host})" if host else f"node {n}": quantile(times, 0.5)
            for (n, host), times in sorted(nodes.items())}


def comms_counts(rank_metrics: Iterable[Mapping[str, float] | None]) -> dict[str, int]:
    """comms.<kind>.calls_per_step / .bytes_per_step of the rank with the most, from each rank's flat probe metrics
    (ProbeResult.metrics()). A kind's bytes are left out where any rank had calls of unknown size: an exact baseline
    must not hold the bytes of part of the calls."""
    calls: dict[str, int] = {}
    sized: dict[str, int | None] = {}  # None: some rank had calls of unknown size
    for m in rank_metrics:
        m = m or {}
        for name, value in m.items():
            # comms.<kind>.calls_per_step; reports written before it was named so: comms.<kind>.per_step
            if not (name.startswith("comms.") and name.count(".") == 2
                    and name.endswith((".calls_per_step", ".per_step"))):
                continue
            kind = name.split(".")[1]
            calls[kind] = max(calls.get(kind, 0), int(value))
            size, before = m.get(f"comms.{kind}.bytes_per_step"), sized.get(kind, 0)
            sized[kind] = None if size is None or before is None else max(before, int(size))
    out: dict[str, int] = {}
    for kind in sorted(calls):
        out[f"comms.{kind}.calls_per_step"] = calls[kind]
        if sized[kind] is not None:
            out[f"comms.{kind}.bytes_per_step"] = sized[kind]  # type: ignore[assignment]
    return out


def rank_probe_metrics(rank: Any) -> dict[str, float] | None:
    probes = getattr(rank, "probes", None)
    return probes.metrics() if probes is not None and hasattr(probes, "metrics") else None


def run_comms(run: "RunResult") -> dict[str, int]:
    return comms_counts([rank_probe_metrics(k) for k in run.ranks])


@dataclass(frozen=True)
class RunFigures:
    """One run's figures, derived once from its ranks (run_figures). `comms` is empty where it was not probed."""

    id: str
    step_time: float  # s
    peak_memory: float  # bytes
    optimizer_state_bytes: float  # summed over ranks
    work: dict[str, float] = field(default_factory=dict)
    gpu_busy: float | None = None
    comms: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RunFigures":
        return cls(id=str(d.get("id") or ""), step_time=float(d["step_time"]), peak_memory=float(d["peak_memory"]),
                   optimizer_state_bytes=float(d["optimizer_state_bytes"]),
                   work={str(k): float(v) for k, v in (d.get("work") or {}).items()},
                   gpu_busy=None if d.get("gpu_busy") is None else float(d["gpu_busy"]),
                   comms={str(k): int(v) for k, v in (d.get("comms") or {}).items()})


def run_figures(run: "RunResult") -> RunFigures:
    return RunFigures(id=run.id, step_time=run_step_time(run), peak_memory=run_peak_memory(run),
                      optimizer_state_bytes=float(sum(k.optimizer_state_bytes for k in run.ranks)),
                      work=run_work(run), gpu_busy=run_gpu_busy(run), comms=run_comms(run))


def metric_values(runs: Sequence[RunFigures]) -> dict[str, list[float]]:
    """The gated and tracked metrics of a job, one value per run (the baseline's and the history's series). A work
    time needs every run; an exact count is measured in the first run of each test's runs of a job only
    (rank/work.py) and kept from the runs that measured it. Collectives only where every run was probed (a kind not called counts 0)."""
    out = {"step_time": [f.step_time for f in runs], "peak_memory": [f.peak_memory for f in runs],
           "optimizer_state_bytes": [f.optimizer_state_bytes for f in runs]}
    if not runs:
        return out
    for name in sorted(set().union(*(f.work for f in runs))):
        measured = [float(f.work[name]) for f in runs if name in f.work]
        if len(measured) == len(runs) or (name in WORK_METRICS and WORK_METRICS[name][1] == "count"):
            out[name] = measured
    if all(f.comms for f in runs):
        for name in sorted(set().union(*(f.comms for f in runs))):
            out[name] = [float(f.comms.get(name, 0)) for f in runs]
    return out


def job_id(runs: Sequence["RunResult"]) -> str:
    """A job's stable id: its first run's. Tests that share a job's runs share the run list, which only grows at
    its end, so every test's view of the job carries the same id, however many runs it saw."""
    return f"job-{runs[0].id}" if runs else ""


def work_not_measured(runs: Sequence["RunResult"]) -> dict[str, str]:
    """Why a work figure is missing, from the first rank that said so."""
    out: dict[str, str] = {}
    for run in runs:
        for r in run.ranks:
            for name, why in (r.work.not_measured if r.work is not None else {}).items():
                out.setdefault(name, why)
    return out


def memory_kind(device: str) -> str:
    return "CUDA peak allocated" if device == "cuda" else "host RSS growth during training"


def memory_metric(device: str) -> str:
    """The memory figure a memory check and the baseline gate decide on."""
    return "peak_memory" if device == "cuda" else "train_memory"


def secondary_memory_metric(device: str) -> str | None:
    """The memory figure shown beside the deciding one, never decided on: host RSS growth on CPU."""
    return None if device == "cuda" else "peak_memory"


def memory_words(metric: str, device: str) -> str:
    if metric == "train_memory":
        return "training state (parameters, gradients, optimizer state + a step's allocation peak)"
    return memory_kind(device)


def secondary_words(metric: str, device: str) -> str:
    return (f"{memory_words(metric, device)} ({metric}; shown, not decided on: it counts imports and one-time "
            "allocations)")


TIME_PARTS = ("startup", "build", "warmup", "timed", "after", "other")


def run_time_split(run: "RunResult") -> dict[str, float] | None:
    """A run's own wall time (slot waits, the session's agent start and op builds left out) in TIME_PARTS: start-up
    (launch to the build's start on the latest rank), the build, warm-up, the timed steps, the steps measured after
    them (work figures, probes, step breakdown) and the rest (the ranks' ending, the launcher's own). None when a
    part was not recorded."""
    started = [getattr(r, "build_started_at", None) for r in run.ranks]
    launched = getattr(run, "launched_at", None)
    if launched is None or not started or any(t is None for t in started):
        return None
    agent = getattr(run, "agent_start_seconds", 0.0)
    wall = max(0.0, run.wall_seconds - run.slot_wait_seconds - agent - getattr(run, "op_build_seconds", 0.0))
    # Ranks a framework starts one after another overlap: the build ends when the last rank's does.
    built = max(s + r.build_seconds for s, r in zip(started, run.ranks))
    split = {"startup": max(0.0, max(started) - launched - agent), "build": max(0.0, built - max(started)),
             "warmup": max(r.warmup_seconds for r in run.ranks), "timed": math.fsum(run.step_times),
             "after": max(getattr(r, "after_seconds", 0.0) for r in run.ranks)}
    split["other"] = max(0.0, wall - math.fsum(split.values()))
    return {"wall": wall, **split}


def job_time_split(runs: Sequence["RunResult"]) -> dict[str, float]:
    """TIME_PARTS summed over the runs, with `wall` and each part's `<part>_share`; {} when a run lacks a part."""
    splits = [run_time_split(r) for r in runs]
    if not splits or any(s is None for s in splits):
        return {}
    total = {k: math.fsum(s[k] for s in splits) for k in ("wall", *TIME_PARTS)}  # type: ignore[index]
    shares = {f"{k}_share": (total[k] / total["wall"] if total["wall"] > 0 else 0.0) for k in TIME_PARTS}
    return {k: round(v, 4) for k, v in {**total, **shares}.items()}


def time_split_text(split: dict[str, float]) -> str:
    """The one wording of where runs' wall time went: '12.0 s of runs: start-up 4.0 s (33%), build ...'."""
    wall = split.get("wall") or 0.0
    if wall <= 0:
        return ""
    names = {"startup": "start-up (launch to the build)", "build": "build", "warmup": "warm-up",
             "timed": "timed steps", "after": "after timing (work figures, probes, breakdown)", "other": "other"}
    return f"{wall:.1f} s of runs: " + ", ".join(f"{names[p]} {split[p]:.1f} s ({split[p] / wall:.0%})"
                                                 for p in TIME_PARTS if p in split)


def _side_breakdown(runs: Iterable[Any]) -> dict[str, float]:
    """A comparison side's step breakdown: of each run its slowest rank's, then the run with the median total."""
    def slowest(ranks: Iterable[Any]) -> dict[str, float]:
        per_rank = [r.step_breakdown for r in ranks if getattr(r, "step_breakdown", None)]
        return dict(max(per_rank, key=lambda b: b["total"])) if per_rank else {}

    return median_step(slowest(r.ranks) for r in runs)


def breakdown_lines(a_side: "JobRuns", b_side: "JobRuns") -> list[str]:
    """Lines for a failing step-time check; none when a side has no breakdown."""
    a, b = _side_breakdown(a_side.runs), _side_breakdown(b_side.runs)
    if not a or not b:
        return []
    # the standard phases, then any a user named (pytest_distperf.phase), then other and total
    keys = list(PHASES) + sorted({k for s in (a, b) for k in s} - set(ALL_KEYS)) + ["other", "total"]
    diffs = {k: a.get(k, 0.0) - b.get(k, 0.0) for k in keys if k != "total"}
    worst = max(diffs, key=lambda k: diffs[k])

    def line(side: dict[str, float]) -> str:
        return " | ".join(f"{k} {fmt_seconds(side.get(k, 0.0))}" for k in keys)

    return [
        "  where the time goes (per step, slowest rank, device-synchronised phases measured after the timing phase):",
        f"    A {a_side.label}: {line(a)}",
        f"    B {b_side.label}: {line(b)}",
        "    A - B: " + ", ".join(f"{k} {'+' if d >= 0 else '-'}{fmt_seconds(abs(d))}" for k, d in diffs.items())
        + f"; the largest share of the gap is in {worst!r}",
    ]


@dataclass(frozen=True)
class JobFigures:
    """A job's reported figures over its runs."""

    label: str
    device: str
    config_hash: str
    runs: int
    steps: int  # timed steps per run
    step_time: float  # s
    run_step_times: tuple[float, ...]  # s, one per run
    run_cv: float | None
    step_p10: float
    step_p90: float
    peak_memory: float  # bytes
    memory_kind: str
    tokens_per_s: float
    optimizer_bytes_per_param: float
    cuda_peak_reserved: int | None = None  # bytes, the highest rank's, the largest over runs
    work: dict[str, float] = field(default_factory=dict)  # empty when the job ran no work phase
    gpu_busy_share: float | None = None  # GPU busy / step time, geometric mean of the runs; CUDA only
    work_not_measured: dict[str, str] = field(default_factory=dict)  # figure -> why it is missing
    id: str = ""  # job_id: shared runs are one job by identity, never by value
    run_ids: tuple[str, ...] = ()
    time_split: dict[str, float] = field(default_factory=dict)

    @property
    def host_bound(self) -> bool:
        """The GPU idles more than half of the step: wall time then holds the host's noise."""
        return self.gpu_busy_share is not None and self.gpu_busy_share < HOST_BOUND_BELOW

    def host_bound_text(self) -> str | None:
        """'host-bound: GPU busy 28 % of the step; wall-time noise is the host's' (None when not host-bound)."""
        if not self.host_bound:
            return None
        spread = f" (run-to-run {self.run_cv:.1%})" if self.run_cv is not None else ""
        return f"host-bound: GPU busy {self.gpu_busy_share:.0%} of the step; wall-time noise{spread} is the host's"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "run_step_times": list(self.run_step_times), "run_ids": list(self.run_ids),
                "host_bound": self.host_bound, "host_bound_text": self.host_bound_text()}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "JobFigures":
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        optional = {"cuda_peak_reserved", "run_cv", "work", "gpu_busy_share", "work_not_measured", "id", "run_ids",
                    "time_split"}
        missing = sorted(set(cls.__dataclass_fields__) - set(fields) - optional)
        if missing:
            raise ValueError(f"job figures: missing {missing}")
        fields["run_step_times"] = tuple(float(x) for x in fields["run_step_times"])
        fields["run_ids"] = tuple(str(x) for x in fields.get("run_ids") or ())
        return cls(**fields)


@dataclass
class JobRuns:
    """One job of a test and its runs so far. Its run lists may be shared with other tests and grow (adaptive
    repeats), so `runs` reads them as they stand, each run once."""

    label: str
    sources: list[list["RunResult"]] = field(default_factory=list)
    base_runs: list["RunResult"] = field(default_factory=list)  # head vs base: runs[i]'s twin on the base's code
    base_error: str = ""  # head vs base: the base side failed (its first lines); no more pairs are run

    @property
    def runs(self) -> list["RunResult"]:
        return list({id(r): r for source in self.sources for r in source}.values())

    def add(self, runs: list["RunResult"]) -> None:
        if not any(source is runs for source in self.sources):
            self.sources.append(runs)

    @property
    def figures(self) -> JobFigures:
        return job_figures(self.label, self.runs)


def job_figures(label: str, runs: Sequence["RunResult"]) -> JobFigures:
    if not runs:
        raise ValueError(f"{label}: no runs")
    per_run = [run_figures(r) for r in runs]
    step_times = tuple(f.step_time for f in per_run)
    steps = [t for r in runs for t in r.step_times]
    step_time = geometric_mean(step_times)
    reserved = [k.cuda_peak_reserved for r in runs for k in r.ranks if k.cuda_peak_reserved]
    device = runs[0].spec.device
    series = metric_values(per_run)
    work = {n: (max(series[n]) if WORK_METRICS.get(n, ("", "memory"))[1] == "count" else geometric_mean(series[n]))
            for n in sorted(set().union(*(f.work for f in per_run))) if n in series}
    busy = [f.gpu_busy for f in per_run]
    share = (geometric_mean([b / t for b, t in zip(busy, step_times)])  # type: ignore[operator]
             if all(b is not None for b in busy) else None)
    return JobFigures(
        label=label, work=work, gpu_busy_share=share, work_not_measured=work_not_measured(runs), device=device,
        config_hash=runs[0].spec.config_hash(), runs=len(runs), steps=len(runs[0].step_times), step_time=step_time,
        run_step_times=step_times, run_cv=relative_spread(step_times),
        step_p10=quantile(steps, 0.1), step_p90=quantile(steps, 0.9),
        peak_memory=geometric_mean([f.peak_memory for f in per_run]), memory_kind=memory_kind(device),
        tokens_per_s=runs[0].tokens_per_step / step_time,
        optimizer_bytes_per_param=runs[0].optimizer_bytes_per_param,
        cuda_peak_reserved=max(reserved) if reserved else None, id=job_id(runs), run_ids=tuple(f.id for f in per_run),
        time_split=job_time_split(runs))
