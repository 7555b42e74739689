"""The profiler around probed steps: one Recorder for the probe phase and for user functions.

Inside a rank (a strategy's probe phase, or a function run by ``distperf.run_function``)::

    from pytest_distperf.rank import probes

    with probes.Recorder(("comms",)) as rec:
        for batch in batches:
            with rec.step():
                train_step(batch)
    return rec.result()  # a ProbeResult, plain data

Each ``rec.step()`` is a ``distperf:step`` range; it ends with a device synchronisation, so
the step's GPU work lies inside its range. Work outside ``step()`` (e.g. a profiler warm-up
step) is recorded in the trace but belongs to no step.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile, record_function

from pytest_distperf.launch.devices import usable_cores
from pytest_distperf.rank.probes import comms, overlap, placement
from pytest_distperf.rank.probes.results import PlacementResult, ProbeResult
from pytest_distperf.rank.probes.timeline import step_timeline
from pytest_distperf.rank.probes.trace import STEP_MARK, Trace, collector_paused, export
from pytest_distperf.rank.timing import StepTimer
from pytest_distperf.spec.probes import PROBES, validate

NEEDS_CUDA = "needs CUDA: on CPU there are no kernels, streams or host/device copies to measure"


def _default_device() -> torch.device:
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def profile_all_threads() -> dict[str, Any]:
    """Record ops of every thread, not only the one that started the profiler: on CUDA the backward pass
    (FSDP2's collectives, ZeRO-3's hooks) runs on autograd's device threads, and Lightning's Trainer runs its
    loop on another thread than the measurement. Older torch has no such switch: it records the calling thread."""
    try:
        from torch._C._profiler import _ExperimentalConfig

        return {"experimental_config": _ExperimentalConfig(profile_all_threads=True)}
    except (ImportError, TypeError):
        return {}


class Recorder:
    def __init__(self, probes: Any = ("comms",), *, device: Any = None, trace_path: str | None = None,
                 optimizer: Any = None, group_size: int | None = None):
        """`trace_path`: where the Chrome trace is kept (default: a temporary file, removed after reading).
        `optimizer`: the torch optimizer whose state placement is read; `group_size`: see comms.py
        (default: the world size)."""
        self.probes = validate(probes, "Recorder(probes=...)")
        if not self.probes:
            raise ValueError(f"Recorder(probes=...) needs at least one probe; known probes: "
                             f"{', '.join(PROBES)}")
        self.device = torch.device(device) if device is not None else _default_device()
        self.cuda = self.device.type == "cuda"
        self._sync = StepTimer(self.device).sync
        self.trace_path = trace_path
        self.optimizer = optimizer
        self.group_size = group_size or (dist.get_world_size() if dist.is_initialized() else 1)
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self._steps = 0
        self._cpu = self._wall = 0.0
        self._prof: profile | None = None
        self._result: ProbeResult | None = None

    def __enter__(self) -> "Recorder":
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        # record_shapes: the comms probe reads each collective's tensor shapes and dtypes.
        self._prof = profile(activities=activities, record_shapes=True, **profile_all_threads())
        self._prof.__enter__()
        return self

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        self._sync()
        c0, w0 = time.process_time(), time.perf_counter()
        with record_function(STEP_MARK):
            yield
            self._sync()
        self._cpu += time.process_time() - c0
        self._wall += time.perf_counter() - w0
        self._steps += 1

    def __exit__(self, *exc: Any) -> None:
        assert self._prof is not None
        self._prof.__exit__(*exc)
        if exc[0] is None:
            with collector_paused():
                self._result = self._analyse(self._prof)

    def result(self) -> ProbeResult:
        if self._result is None:
            raise RuntimeError("Recorder.result() is available after the `with Recorder(...)` block ends")
        return self._result

    def _analyse(self, prof: profile) -> ProbeResult:
        if self._steps == 0:
            raise RuntimeError("the Recorder saw no step: wrap each step in `with recorder.step():`")
        # the event tree is read only where collectives are counted from c10d ops (gloo; comms.py)
        gloo_comms = "comms" in self.probes and not self.cuda
        roots = prof.profiler.kineto_results.experimental_event_tree() if gloo_comms else []
        trace = Trace(export(prof, self.trace_path))
        if len(trace.steps) != self._steps:
            raise RuntimeError(f"the probe trace holds {len(trace.steps)} {STEP_MARK} ranges for "
                               f"{self._steps} steps; nested Recorder.step() blocks are not supported")
        result = ProbeResult(rank=self.rank, device=self.device.type, steps=self._steps, probes=list(self.probes),
                             trace_path=self.trace_path, timeline=step_timeline(trace, self.rank))
        if "comms" in self.probes:
            result.comms = comms.measure(roots, self.group_size, trace if self.cuda else None)
            for kind, st in result.comms.by_kind.items():
                if st.unsized:
                    result.not_measured[f"comms.{kind}.bytes"] = (f"{st.unsized} {kind} call(s) had no size in the "
                                                                  f"record ({result.comms.source})")
        if "overlap" in self.probes:
            if self.cuda:
                result.overlap = overlap.measure(trace)
            else:
                result.not_measured["overlap"] = NEEDS_CUDA
        if "placement" in self.probes:
            state_bytes, state_tensors = placement.optimizer_state(self.optimizer) if self.optimizer else ({}, {})
            result.placement = PlacementResult(
                steps=self._steps, optimizer=placement.optimizer_steps(trace, self.cuda), state_bytes=state_bytes,
                state_tensors=state_tensors, cpu_seconds=self._cpu, wall_seconds=self._wall, cpu_cores=usable_cores(),
                copies=placement.copies(trace) if self.cuda else None)
            if not self.cuda:
                result.not_measured["placement.copies"] = NEEDS_CUDA
                result.not_measured["placement.gpu_kernels"] = NEEDS_CUDA
        return result
