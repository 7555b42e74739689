"""The probe phase of a strategy job: extra steps after the timing phase, so probes never
change the reported step time or memory peaks (both are read before this runs).

1. placement only: `probe_steps` un-profiled steps for CPU utilisation (process CPU time over
   wall time; the profiler's own bookkeeping would inflate it);
2. one step under the profiler that belongs to no probed step (CUPTI and profiler set-up);
3. `probe_steps` profiled steps, each a `distperf:step` range.
The Chrome trace is written to the job folder as `probe-trace-rank{r}.json`.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Generator

from pytest_distperf.rank.hostload import CpuMeter
from pytest_distperf.rank.work import drive
from pytest_distperf.rank.probes.recorder import Recorder
from pytest_distperf.rank.probes.results import ProbeResult

TRACE_NAME = "probe-trace-rank{rank}.json"


def run_probe_phase(*, step: Callable[[int], Any], **kwargs: Any) -> ProbeResult:
    """`step(i)` runs training step i (any batch); the other arguments are `probe_passes`'."""
    return drive(probe_passes(**kwargs), step)


def probe_passes(*, probes: tuple[str, ...], steps: int, sync: Callable[[], None], device: Any, optimizer: Any,
                 group_size: int, rank: int, job_dir: str,
                 progress: Callable[[str], None] | None = None) -> Generator[int, None, ProbeResult]:
    """The phase as a generator that yields i where step i runs (rank/work.drive); `sync()` waits for the
    device. A script's optimizer steps drive it too (rank/script_steps.py)."""
    cpu = wall = None
    if "placement" in probes:
        if progress:
            progress("probe phase: CPU utilisation steps")
        meter = CpuMeter()
        sync()
        meter.start()
        for i in range(steps):
            yield i
        sync()
        window = meter.stop()
        cpu, wall = window.process_seconds, window.wall_seconds
    recorder = Recorder(probes, device=device, trace_path=os.path.join(job_dir, TRACE_NAME.format(rank=rank)),
                        optimizer=optimizer, group_size=group_size)
    with recorder:
        yield 0  # profiler warm-up, outside every distperf:step range
        for i in range(steps):
            if progress:
                progress(f"probe phase: profiled step {i + 1}/{steps}")
            with recorder.step():
                yield i
    result = recorder.result()
    if result.placement is not None and cpu is not None and wall is not None:
        result.placement.cpu_seconds, result.placement.wall_seconds = cpu, wall
    return result
