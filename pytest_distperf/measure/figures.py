"""One definition of each reported quantity of a job. Every table, check, the baseline gate and every report
(terminal, JSON, JUnit, Markdown, the pytest-benchmark export) reads these, and nothing else computes them.

- step time of a run (`run_step_time`): the median over the run's timed steps of each step's time, where a
  step's time is the slowest rank's (collectives make every rank wait for the slowest one).
- step time of a job (`JobFigures.step_time`): the geometric mean of its runs' step times. The ratio of two
  jobs' step times is then exactly the ratio the checks decide on (the geometric mean of the interleaved pair
  ratios), and a job against its baseline exactly the gate's ratio (of the geometric means of the runs).
- run-to-run variation (`run_cv`): the sd of the log run step times, about their relative spread.
- within-run spread: p10 and p90 over every timed step of every run (slowest rank per step).
- peak memory of a run (`run_peak_memory`): the highest rank's CUDA peak allocated on CUDA, its host RSS
  growth during training on CPU; of a job: the geometric mean over its runs, like step time.
- collectives per step (`comms.<kind>.calls_per_step` / `.bytes_per_step`): per rank, the rank with the most
  (the probes' per-step medians); never summed over ranks.
- optimizer state: bytes summed over ranks (the whole model's state), and per parameter.
- work figures of a run (`run_work`, from the work phase, rank/work.py): per rank the median over its profiled
  steps of a time (`gpu_time`: compute kernels + memcpy/memset; `instructions_per_step`) and the most of any step
  for a count (`kernels_per_step`, `flops_per_step`, `aten_ops_per_step`); of the run, the rank with the most.
  Of a job: the geometric mean of the runs for a time, the largest run for a count. `train_memory` (CPU): the
  training state's tensor bytes plus a step's allocation peak, the highest rank.
- where a run's wall time goes (`run_time_split`): of the run's own wall time (slot waits left out), start-up
  (launch to the build's start on the latest rank: processes, imports, rendezvous, the libraries' loading), the
  engine build (slowest rank), warm-up, the timed steps (their sum, slowest rank per step) and the rest (work
  phase, probes, breakdown, teardown, results); of a job, each summed over its runs, with its share.
- host-bound share (`gpu_busy_share`): the GPU's busy time in a step (union of its activities over all streams,
  the busiest rank) over the step time; 1 - share is the part of a step the GPU waits for the host.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from pytest_distperf.measure.stats import quantile, relative_spread

if TYPE_CHECKING:
    from pytest_distperf.results import RunResult

HOST_BOUND_BELOW = 0.5  # GPU busy share under which a step is host-bound

# What each quantity is, for the reports' legends: (unit, scope).
SCOPES: dict[str, tuple[str, str]] = {
    "step_time": ("s", "slowest rank per step; median of a run's steps; geometric mean of the runs"),
    "run_cv": ("log sd", "run-to-run: sd of the log run step times"),
    "pair_cv": ("log sd", "pair-to-pair: sd of the log ratios of interleaved pairs"),
    "peak_memory": ("bytes", "highest rank (CUDA peak allocated; CPU: host RSS growth); geometric mean of the runs"),
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
# Work figures (rank/work.py): name -> (the WorkResult field, "time" | "count"). A time is decided on an interval
# against the gate's work_threshold, a count exactly.
WORK_METRICS: dict[str, tuple[str, str]] = {
    "gpu_time": ("gpu_time", "time"),
    "instructions_per_step": ("instructions", "time"),
    "kernels_per_step": ("kernels", "count"),
    "flops_per_step": ("flops", "count"),
    "aten_ops_per_step": ("aten_ops", "count"),
}


def geometric_mean(values: Sequence[float]) -> float:
    """exp(mean(log v)); values below one (a zero RSS growth) count as one, so a ratio stays finite."""
    if not values:
        raise ValueError("geometric mean of no values")
    return math.exp(math.fsum(math.log(max(v, 1e-300)) for v in values) / len(values))


def run_step_time(run: "RunResult") -> float:
    """A run's step time: the median of its steps, each the slowest rank's."""
    return quantile(run.step_times, 0.5)


def run_peak_memory(run: "RunResult") -> float:
    """A run's peak memory in bytes (at least 1, so ratios stay finite): RunResult.peak_memory."""
    return float(max(run.peak_memory, 1))


def run_work(run: "RunResult") -> dict[str, float]:
    """The run's work figures measured on every rank (module docstring), by metric name; `train_memory` on CPU."""
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


TIME_PARTS = ("startup", "build", "warmup", "timed", "other")


def run_time_split(run: "RunResult") -> dict[str, float] | None:
    """A run's own wall time in TIME_PARTS (module docstring), seconds; None when a part was not recorded."""
    started = [getattr(r, "build_started_at", None) for r in run.ranks]
    launched = getattr(run, "launched_at", None)
    if launched is None or not started or any(t is None for t in started):
        return None
    wall = max(0.0, run.wall_seconds - run.slot_wait_seconds)
    split = {"startup": max(0.0, max(started) - launched), "build": max(r.build_seconds for r in run.ranks),
             "warmup": max(r.warmup_seconds for r in run.ranks), "timed": math.fsum(run.step_times)}
    split["other"] = max(0.0, wall - math.fsum(split.values()))
    return {"wall": wall, **split}


def job_time_split(runs: Sequence["RunResult"]) -> dict[str, float]:
    """TIME_PARTS summed over the runs, with `wall` and each part's share of it (`<part>_share`); {} when a run
    lacks a part."""
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
             "timed": "timed steps", "other": "other"}
    return f"{wall:.1f} s of runs: " + ", ".join(f"{names[p]} {split[p]:.1f} s ({split[p] / wall:.0%})"
                                                 for p in TIME_PARTS)


@dataclass(frozen=True)
class JobFigures:
    """A job's reported figures over its runs (see the module docstring for each definition)."""

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
    # The work figures (WORK_METRICS and train_memory) measured on every run: geometric mean of a time, the
    # largest run of a count; empty when the job ran no work phase.
    work: dict[str, float] = field(default_factory=dict)
    gpu_busy_share: float | None = None  # GPU busy / step time, geometric mean of the runs; CUDA only
    work_not_measured: dict[str, str] = field(default_factory=dict)  # figure -> why it is missing
    time_split: dict[str, float] = field(default_factory=dict)  # job_time_split: where the runs' wall time went

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
        d = asdict(self)
        d["run_step_times"] = list(self.run_step_times)
        d["host_bound"] = self.host_bound
        d["host_bound_text"] = self.host_bound_text()  # the one wording every report shows
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "JobFigures":
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        optional = {"cuda_peak_reserved", "run_cv", "work", "gpu_busy_share", "work_not_measured", "time_split"}
        missing = sorted(set(cls.__dataclass_fields__) - set(fields) - optional)
        if missing:
            raise ValueError(f"job figures: missing {missing}")
        fields["run_step_times"] = tuple(float(x) for x in fields["run_step_times"])
        return cls(**fields)


def job_figures(label: str, runs: Sequence["RunResult"]) -> JobFigures:
    if not runs:
        raise ValueError(f"{label}: no runs")
    per_run = tuple(run_step_time(r) for r in runs)
    steps = [t for r in runs for t in r.step_times]
    step_time = geometric_mean(per_run)
    reserved = [k.cuda_peak_reserved for r in runs for k in r.ranks if k.cuda_peak_reserved]
    device = runs[0].spec.device
    per_run_work = [run_work(r) for r in runs]
    names = set(per_run_work[0]).intersection(*per_run_work[1:])
    work = {n: (max(w[n] for w in per_run_work) if WORK_METRICS.get(n, ("", "memory"))[1] == "count"
                else geometric_mean([w[n] for w in per_run_work])) for n in sorted(names)}
    busy = [run_gpu_busy(r) for r in runs]
    share = (geometric_mean([b / t for b, t in zip(busy, per_run)]) if all(b is not None for b in busy) else None)
    return JobFigures(
        label=label, work=work, gpu_busy_share=share, work_not_measured=work_not_measured(runs), device=device, config_hash=runs[0].spec.config_hash(), runs=len(runs),
        steps=len(runs[0].step_times), step_time=step_time, run_step_times=per_run, run_cv=relative_spread(per_run),
        step_p10=quantile(steps, 0.1), step_p90=quantile(steps, 0.9),
        peak_memory=geometric_mean([run_peak_memory(r) for r in runs]), memory_kind=memory_kind(device),
        tokens_per_s=runs[0].tokens_per_step / step_time,
        optimizer_bytes_per_param=runs[0].optimizer_bytes_per_param,
        cuda_peak_reserved=max(reserved) if reserved else None, time_split=job_time_split(runs))
