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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Sequence

from pytest_distperf.measure.stats import quantile, relative_spread

if TYPE_CHECKING:
    from pytest_distperf.results import RunResult

# What each quantity is, for the reports' legends: (unit, scope).
SCOPES: dict[str, tuple[str, str]] = {
    "step_time": ("s", "slowest rank per step; median of a run's steps; geometric mean of the runs"),
    "run_cv": ("log sd", "run-to-run: sd of the log run step times"),
    "pair_cv": ("log sd", "pair-to-pair: sd of the log ratios of interleaved pairs"),
    "peak_memory": ("bytes", "highest rank (CUDA peak allocated; CPU: host RSS growth); geometric mean of the runs"),
    "comms": ("calls, bytes", "per step, per rank (the rank with the most)"),
    "optimizer_state_bytes": ("bytes", "summed over ranks"),
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


def memory_kind(device: str) -> str:
    return "CUDA peak allocated" if device == "cuda" else "host RSS growth during training"


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

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["run_step_times"] = list(self.run_step_times)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "JobFigures":
        fields = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        missing = sorted(set(cls.__dataclass_fields__) - set(fields) - {"cuda_peak_reserved", "run_cv"})
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
    return JobFigures(
        label=label, device=device, config_hash=runs[0].spec.config_hash(), runs=len(runs),
        steps=len(runs[0].step_times), step_time=step_time, run_step_times=per_run, run_cv=relative_spread(per_run),
        step_p10=quantile(steps, 0.1), step_p90=quantile(steps, 0.9),
        peak_memory=geometric_mean([run_peak_memory(r) for r in runs]), memory_kind=memory_kind(device),
        tokens_per_s=runs[0].tokens_per_step / step_time,
        optimizer_bytes_per_param=runs[0].optimizer_bytes_per_param,
        cuda_peak_reserved=max(reserved) if reserved else None)
