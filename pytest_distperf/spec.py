"""Plain data that crosses the process boundary between pytest and the ranks.

Everything here is a dataclass of builtins so it pickles for the local launcher and
turns into JSON for reports and baselines.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_distperf.rank.hostload import CpuWindow
    from pytest_distperf.probes.results import ProbeResult


@dataclass(frozen=True)
class FunctionRef:
    """A module-level function named by where it lives, resolved inside each rank."""

    module: str
    qualname: str
    file: str | None = None


@dataclass
class JobSpec:
    """One job: a strategy on the built-in workload, or a user function, on N ranks."""

    world_size: int
    device: str  # "cpu" or "cuda"
    strategy: str | None = None  # None when `function` is set
    options: dict[str, Any] = field(default_factory=dict)
    shape: str = "tiny"
    shape_overrides: dict[str, Any] = field(default_factory=dict)
    warmup_steps: int = 3
    steps: int = 10
    seed: int = 1234
    function: FunctionRef | None = None
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    sys_path: list[str] = field(default_factory=list)
    progress: bool = False
    # Probe phase after timing (pytest_distperf.probes): which probes, over how many profiled steps.
    probes: tuple[str, ...] = ()
    probe_steps: int = 3

    @property
    def backend(self) -> str:
        return "nccl" if self.device == "cuda" else "gloo"

    def describe(self) -> str:
        if self.function is not None:
            return f"{self.function.qualname} x{self.world_size} {self.device}"
        opts = ",".join(f"{k}={v}" for k, v in sorted(self.options.items()) if k != "ds_config" and v is not None)
        return f"{self.strategy}[{opts}] {self.shape} x{self.world_size} {self.device}".replace("[]", "")

    def config_dict(self, ignore_shape_fields: tuple[str, ...] = ()) -> dict[str, Any]:
        """The parts of the job that decide what is measured (not where or how it is launched).

        ignore_shape_fields: shape overrides left out, e.g. the baseline key ignores the knobs that inject
        a slowdown, so an injected slowdown reads as a regression of the same job, like a code change would.
        """
        d = asdict(self)
        for k in ("sys_path", "progress"):
            d.pop(k)
        if not self.probes:  # jobs without probes keep the hash they had before probes existed
            d.pop("probes")
            d.pop("probe_steps")
        d["shape_overrides"] = {k: v for k, v in d["shape_overrides"].items() if k not in ignore_shape_fields}
        return d

    def config_hash(self, ignore_shape_fields: tuple[str, ...] = ()) -> str:
        blob = json.dumps(self.config_dict(ignore_shape_fields), sort_keys=True, default=repr).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass
class RankResult:
    """What one rank of a strategy job measured. Times are seconds, memory bytes."""

    rank: int
    step_times: list[float]  # this rank's own step times
    losses: list[float]
    cuda_peak_allocated: int | None
    cuda_peak_reserved: int | None
    host_peak_rss: int  # peak RSS during the timing phase
    host_rss_before_build: int  # RSS after imports, before the model was built
    optimizer_state_bytes: int  # optimizer state + master copies held on this rank
    num_params: int  # global parameter count of the workload
    tokens_per_step: int  # global tokens per step (all ranks)
    build_seconds: float
    warmup_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)
    probes: "ProbeResult | None" = None  # the probe phase's measurements, when the job asked for probes
    # Median seconds per phase (forward/backward/optimizer/other/total) over a few device-synchronised
    # steps after the timing phase; empty when the strategy has no step_breakdown (pytest_distperf.rank.breakdown).
    step_breakdown: dict[str, float] = field(default_factory=dict)
    cpu_window: "CpuWindow | None" = None  # CPU readings over the timed loop (hostload.py); None off Linux

    @property
    def host_training_bytes(self) -> int:
        return max(0, self.host_peak_rss - self.host_rss_before_build)


@dataclass
class RunResult:
    """One strategy job, all ranks: the per-step time is the slowest rank's."""

    spec: JobSpec
    ranks: list[RankResult]
    wall_seconds: float

    @property
    def step_times(self) -> list[float]:
        return [max(steps) for steps in zip(*(r.step_times for r in self.ranks))]

    @property
    def host_other_load(self) -> tuple[float, int] | None:
        """(cores other work kept busy while the steps were timed, cores the job may use); see hostload.py."""
        from pytest_distperf.rank.hostload import other_load

        return other_load([getattr(r, "cpu_window", None) for r in self.ranks])

    @property
    def losses(self) -> list[float]:
        """Mean of the ranks' losses per step (each rank trains on its own micro-batch)."""
        n = len(self.ranks)
        return [sum(step) / n for step in zip(*(r.losses for r in self.ranks))]

    @property
    def peak_memory(self) -> int:
        """The memory a comparison gates on: CUDA peak allocated on GPU, training host RSS on CPU."""
        if self.spec.device == "cuda":
            return max(r.cuda_peak_allocated or 0 for r in self.ranks)
        return max(r.host_training_bytes for r in self.ranks)

    @property
    def optimizer_bytes_per_param(self) -> float:
        total = sum(r.optimizer_state_bytes for r in self.ranks)
        return total / max(1, self.ranks[0].num_params)

    @property
    def tokens_per_step(self) -> int:
        return self.ranks[0].tokens_per_step
