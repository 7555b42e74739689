"""What a job measured: plain data that crosses the process boundary from the ranks back to pytest.

Dataclasses of builtins, so they pickle back from the ranks and turn into JSON for reports and baselines.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pytest_distperf.spec.job import JobSpec

if TYPE_CHECKING:
    from pytest_distperf.rank.probes.results import ProbeResult
    from pytest_distperf.rank.clocks import GpuWindow
    from pytest_distperf.rank.hostload import CpuWindow


@dataclass
class WorkResult:
    """What one rank's steps asked of the machine, per profiled step of the work phase (rank/work.py defines each
    figure). Times are seconds, memory bytes; a list is None where the figure was not measured, and
    `not_measured` then says why."""

    steps: int
    gpu_time: list[float] | None = None  # compute kernels + memcpy/memset
    gpu_compute_time: list[float] | None = None
    gpu_comm_time: list[float] | None = None  # communication kernels (their duration includes waiting for peers)
    gpu_copy_time: list[float] | None = None  # memcpy and memset
    gpu_busy: list[float] | None = None  # union of every GPU activity's interval, all streams
    kernels: list[int] | None = None
    flops: list[int] | None = None
    aten_ops: list[int] | None = None
    instructions: list[int] | None = None  # user space, the rank's main thread
    state_bytes: int | None = None  # CPU: parameters, gradients, optimizer state (tensor bytes)
    step_peak_bytes: list[int] | None = None  # CPU: tensor bytes a step allocates above its start, at most
    # Where a step's time goes, by operator (CPU) or kernel (CUDA): row -> [count per step, seconds per step], the
    # top rows and "(other)" (figures/explain.py defines the rows); None where the profiler pass did not run.
    explain: dict[str, list[float]] | None = None
    not_measured: dict[str, str] = field(default_factory=dict)

    def median(self, name: str) -> float | None:
        """The figure's median over the profiled steps; None when not measured."""
        import statistics

        values = getattr(self, name)
        return float(statistics.median(values)) if values else None


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
    gpu_window: "GpuWindow | None" = None  # GPU clocks, throttling, power over the timed loop (clocks.py); CUDA only
    work: WorkResult | None = None  # the work phase (rank/work.py); None when the job ran none
    # Where it ran, on jobs of several nodes (set by rank/entry.py); None / 0 under the local launcher.
    host: str | None = None
    node_rank: int = 0
    build_started_at: float | None = None  # time.time() when the build began (after imports and rendezvous)
    after_seconds: float = 0.0  # the work phase, probes and step breakdown: the steps measured after the timed ones

    @property
    def host_training_bytes(self) -> int:
        return max(0, self.host_peak_rss - self.host_rss_before_build)


@dataclass
class RunResult:
    """One strategy job, all ranks: the per-step time is the slowest rank's."""

    spec: JobSpec
    ranks: list[RankResult]
    wall_seconds: float
    slot_wait_seconds: float = 0.0  # of wall_seconds: waiting for the CPU measurement slot or the GPUs (allocator)
    launched_at: float | None = None  # time.time() when the launcher was called (the slot held)
    # of wall_seconds: the session's warm agent starting (its imports, once a session) when this run needed it first
    agent_start_seconds: float = 0.0
    op_build_seconds: float = 0.0  # of wall_seconds: DeepSpeed's op builds before its launch (once a session)
    # Stable across processes (it pickles with the run): tests that share this run name it by this id.
    id: str = field(default_factory=lambda: f"run-{uuid.uuid4().hex[:12]}", compare=False)

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
