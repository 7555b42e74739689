"""What the probes measured: plain dataclasses of builtins (they cross the rank -> pytest boundary).

No torch here: the pytest process reads these for checks, reports and baselines.
Per-step values are lists with one entry per profiled step, so a check can say "every
step" and a baseline can store exact counts; the properties summarise them (median).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping

from pytest_distperf.rank.probes.trace import Interval, intersection, union


@dataclass
class StepTimeline:
    """When compute and communication ran in one profiled step of one rank (µs from the step's start)."""

    rank: int
    source: str  # what the lanes are: GPU_SOURCE or CPU_SOURCE
    step: int  # which profiled step (0-based) of `steps`
    steps: int
    length: float  # µs, the step's range
    compute: list[Interval]
    comm: list[tuple[float, float, str]]  # (start, end, name)

    def overlap(self) -> list[Interval]:
        """Where compute and communication ran at once."""
        return intersection(self.compute, ((s, e) for s, e, _ in self.comm))

    def comm_time(self) -> float:
        """µs during which some communication ran."""
        return sum(e - s for s, e in union((s, e) for s, e, _ in self.comm))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StepTimeline":
        """A timeline as the JSON document holds it (lists for the tuples)."""
        return cls(rank=int(d["rank"]), source=str(d["source"]), step=int(d["step"]), steps=int(d["steps"]),
                   length=float(d["length"]), compute=[(float(s), float(e)) for s, e in d["compute"]],
                   comm=[(float(s), float(e), str(n)) for s, e, n in d["comm"]])


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


@dataclass
class PerStep:
    """Counts and bytes of one kind of event, one entry per profiled step; medians over the steps."""

    kind: str
    counts: list[int]
    bytes: list[int]

    @property
    def per_step(self) -> float:
        return _median(self.counts)

    @property
    def bytes_per_step(self) -> float:
        return _median(self.bytes)


@dataclass
class CollectiveStats(PerStep):
    """One kind of collective (all_gather, reduce_scatter, ...) over the profiled steps.

    `sizes` are message sizes in bytes, one per collective call, in the nccl-tests
    convention: the full buffer the collective covers (all_gather: the gathered output;
    reduce_scatter: the unsharded input; all_reduce/broadcast: the tensor).
    """

    # counts: calls per step; bytes: sum of message sizes per step
    sizes: list[int]  # every call's message size over all profiled steps
    ops: dict[str, int] = field(default_factory=dict)  # profiler op names seen -> calls (all steps)
    dtypes: dict[str, int] = field(default_factory=dict)  # dtype -> calls (all steps)
    unsized: int = 0  # calls whose record had no size (bytes and sizes leave them out)

    @property
    def size_median(self) -> float:
        return _median(self.sizes)

    @property
    def size_min(self) -> int:
        return min(self.sizes) if self.sizes else 0

    @property
    def size_max(self) -> int:
        return max(self.sizes) if self.sizes else 0


OPS_SOURCE = "c10d ops"  # gloo: the profiler's operator events (rank/probes/comms.py)
NCCL_SOURCE = "NCCL kernels"  # CUDA: the GPU timeline, with the op's arguments on each kernel


@dataclass
class CommsResult:
    steps: int
    by_kind: dict[str, CollectiveStats]
    group_size: int  # used where the profiler gives only one side of a collective (see comms.py)
    source: str = OPS_SOURCE  # what was counted

    def kind(self, kind: str) -> CollectiveStats:
        """The stats of one kind; a kind never seen counts 0 calls every step."""
        return self.by_kind.get(kind) or CollectiveStats(kind, [0] * self.steps, [0] * self.steps, [])


@dataclass
class OverlapResult:
    """Communication-kernel time against compute-kernel time, per step (seconds, CUDA only)."""

    steps: int
    comm_seconds: list[float]  # union of NCCL kernel intervals
    overlapped_seconds: list[float]  # part of it that runs while a compute kernel runs
    compute_seconds: list[float]  # union of non-NCCL kernel intervals
    comm_kernels: list[int]

    @property
    def exposed_seconds(self) -> list[float]:
        return [c - o for c, o in zip(self.comm_seconds, self.overlapped_seconds)]

    @property
    def fraction(self) -> float | None:
        """Share of communication time hidden under compute; None when no NCCL kernel ran."""
        total = sum(self.comm_seconds)
        return sum(self.overlapped_seconds) / total if total > 0 else None

    @property
    def exposed_per_step(self) -> float:
        return _median(self.exposed_seconds)


@dataclass
class CopyStats(PerStep):
    """Memory copies of one direction (HtoD, DtoH, DtoD, ...) per step, from CUPTI memcpy records."""

    pageable_counts: list[int]  # copies from or to pageable (not pinned) host memory
    pageable_bytes: list[int]


@dataclass
class OptimizerStepStats:
    """Time inside one optimizer class's `step()` (torch's `Optimizer.step#<Class>.step` range)."""

    name: str  # the optimizer class, e.g. "AdamW", "DeepSpeedCPUAdam"
    calls: list[int]  # per step
    cpu_seconds: list[float]  # host wall time inside step(), per step
    gpu_kernels: list[int] | None = None  # kernels launched from inside step(), per step (CUDA)
    gpu_kernel_seconds: list[float] | None = None  # their summed device time, per step (CUDA)
    gpu_copies: list[int] | None = None  # memcpy/memset launched from inside step(), per step (CUDA)


@dataclass
class PlacementResult:
    steps: int
    optimizer: dict[str, OptimizerStepStats]
    state_bytes: dict[str, int]  # device type -> bytes of optimizer state + the params it updates
    state_tensors: dict[str, int]  # device type -> number of such tensors
    cpu_seconds: float  # process CPU time (all threads) over un-profiled steps
    wall_seconds: float  # their wall time
    cpu_cores: int  # cores this process may run on
    copies: dict[str, CopyStats] | None = None  # CUDA only

    @property
    def cpu_utilisation(self) -> float:
        """Busy cores during the step: process CPU time over wall time (1.0 = one core flat out)."""
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0

    def copy(self, kind: str) -> CopyStats:
        copies = self.copies or {}
        return copies.get(kind) or CopyStats(kind, [0] * self.steps, [0] * self.steps, [0] * self.steps,
                                            [0] * self.steps)

    def pageable_per_step(self) -> list[int]:
        per = [0] * self.steps
        for c in (self.copies or {}).values():
            per = [a + b for a, b in zip(per, c.pageable_counts)]
        return per


@dataclass
class ProbeResult:
    """Everything one rank's probe phase measured."""

    rank: int
    device: str
    steps: int
    probes: list[str]
    comms: CommsResult | None = None
    overlap: OverlapResult | None = None
    placement: PlacementResult | None = None
    trace_path: str | None = None  # the Chrome trace of the probe phase (open in https://ui.perfetto.dev)
    timeline: StepTimeline | None = None  # one profiled step's compute and communication, from that trace
    not_measured: dict[str, str] = field(default_factory=dict)  # probe -> why it has nothing to measure

    def metrics(self) -> dict[str, float]:
        """Flat numbers for reports and baselines (counts are exact per-step medians)."""
        m: dict[str, float] = {}
        if self.comms:
            for kind, s in sorted(self.comms.by_kind.items()):
                m[f"comms.{kind}.calls_per_step"] = s.per_step  # the name verdicts, baselines and history use
                if s.unsized:  # bytes of part of the calls are not the calls' bytes
                    continue
                m[f"comms.{kind}.bytes_per_step"] = s.bytes_per_step
                m[f"comms.{kind}.size_median"] = s.size_median
                m[f"comms.{kind}.size_min"] = s.size_min
                m[f"comms.{kind}.size_max"] = s.size_max
        if self.overlap:
            if self.overlap.fraction is not None:
                m["overlap.fraction"] = self.overlap.fraction
            m["overlap.comm_per_step_s"] = _median(self.overlap.comm_seconds)
            m["overlap.exposed_per_step_s"] = self.overlap.exposed_per_step
        if self.placement:
            p = self.placement
            m["placement.cpu_utilisation"] = p.cpu_utilisation
            for dev, n in sorted(p.state_bytes.items()):
                m[f"placement.state_bytes.{dev}"] = n
            for name, o in sorted(p.optimizer.items()):
                m[f"placement.optimizer.{name}.cpu_s"] = _median(o.cpu_seconds)
                if o.gpu_kernels is not None:
                    m[f"placement.optimizer.{name}.gpu_kernels"] = _median(o.gpu_kernels)
                    m[f"placement.optimizer.{name}.gpu_kernel_s"] = _median(o.gpu_kernel_seconds or [])
            for kind, c in sorted((p.copies or {}).items()):
                m[f"placement.copies.{kind}.per_step"] = c.per_step
                m[f"placement.copies.{kind}.bytes_per_step"] = c.bytes_per_step
            if p.copies is not None:
                m["placement.copies.pageable_per_step"] = _median(p.pageable_per_step())
        return m


@dataclass
class ProbeSummary:
    """A job's probe results as the reports show them: the worst rank's metrics of the first run (least overlap,
    most of everything else, as the checks read them), every trace, and each rank's step timeline of the first
    run."""

    label: str
    device: str
    runs: int
    steps: int
    probes: list[str]
    metrics: dict[str, float]
    not_measured: dict[str, str] = field(default_factory=dict)
    traces: list[str] = field(default_factory=list)
    timelines: list[dict[str, Any]] = field(default_factory=list)  # StepTimeline, as JSON

    def to_json(self) -> dict[str, Any]:
        return {"kind": "probe", **asdict(self)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ProbeSummary":
        return cls(label=str(d["label"]), device=str(d.get("device") or ""), runs=int(d.get("runs") or 0),
                   steps=int(d.get("steps") or 0), probes=[str(p) for p in d.get("probes") or []],
                   metrics={str(k): float(v) for k, v in (d.get("metrics") or {}).items()},
                   not_measured=dict(d.get("not_measured") or {}), traces=list(d.get("traces") or []),
                   timelines=list(d.get("timelines") or []))


def probe_summary(label: str, runs: list[Any]) -> ProbeSummary:
    """The probe summary of a job's runs (ProbeSummary)."""
    results = [r.probes for run in runs for r in run.ranks if r.probes is not None]
    first: ProbeResult | None = results[0] if results else None
    per_rank = [r.probes.metrics() for r in runs[0].ranks if r.probes is not None]
    worst: dict[str, float] = {}
    for m in per_rank:
        for key, value in m.items():
            pick = min if key == "overlap.fraction" else max
            worst[key] = pick(worst[key], value) if key in worst else value
    return ProbeSummary(
        label=label, device=runs[0].spec.device, runs=len(runs), steps=first.steps if first else 0,
        probes=list(runs[0].spec.probes), metrics=worst, not_measured=dict(first.not_measured) if first else {},
        traces=[r.trace_path for r in results if r.trace_path],
        timelines=[asdict(r.probes.timeline) for r in runs[0].ranks
                   if r.probes is not None and r.probes.timeline is not None])
