"""Was the machine busy with other work while the ranks were timed? Step times are only as honest as it is quiet.

Each rank reads, around its timed loop, the busy time of the cores it may run on (``/proc/stat``, per CPU) and
its own process's CPU time (all threads); the pytest process subtracts what the ranks used from what the cores
did, and warns when the rest is more than a core or a tenth of the cores. Ranks pinned to disjoint slices (CPU
jobs) each read their own slice; unpinned ranks (CUDA jobs) read the same cores, which count once. Only the
cores this job may use count (a container's cpuset). Linux only; elsewhere nothing is read and nothing is said.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass

OTHER_LOAD_FLOOR_CORES = 1.0
OTHER_LOAD_FRACTION = 0.1


@dataclass
class CpuWindow:
    """One rank's CPU readings over its timed loop (crosses the rank -> pytest boundary)."""

    wall_seconds: float
    process_seconds: float  # this rank's own CPU time, all its threads
    cpus: tuple[int, ...] = ()  # the cores this rank may run on (empty off Linux)
    busy_seconds: float | None = None  # busy time of those cores, all processes; None off Linux


def parse_proc_stat(text: str, cpus: tuple[int, ...]) -> int:
    """Busy jiffies (all but idle and iowait) summed over the given cores of a /proc/stat text."""
    wanted = {f"cpu{c}" for c in cpus}
    busy = 0
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] in wanted:
            values = [int(v) for v in fields[1:]]
            busy += sum(values[:8]) - values[3] - values[4]  # user..steal, without idle and iowait
    return busy


class CpuMeter:
    """start() before a loop, stop() after it: the rank's CPU time over wall time (everywhere) and the
    busy time of its cores (Linux). The one reading of process CPU time: the timed loop and the
    placement probe's utilisation steps both use it."""

    def __init__(self) -> None:
        try:
            self.cpus = tuple(sorted(os.sched_getaffinity(0)))
            self.ticks = os.sysconf("SC_CLK_TCK")
            self._busy()
        except (AttributeError, OSError, ValueError):
            self.cpus = ()

    def _busy(self) -> int:
        with open("/proc/stat") as f:
            return parse_proc_stat(f.read(), self.cpus)

    def start(self) -> None:
        self._start = (time.perf_counter(), time.process_time(), self._busy() if self.cpus else 0)

    def stop(self) -> CpuWindow:
        wall0, proc0, busy0 = self._start
        return CpuWindow(wall_seconds=time.perf_counter() - wall0, process_seconds=time.process_time() - proc0,
                         cpus=self.cpus,
                         busy_seconds=(self._busy() - busy0) / self.ticks if self.cpus else None)


def other_load(windows: list[CpuWindow | None]) -> tuple[float, int] | None:
    """(cores busy on average with work other than these ranks, cores the job may use), or None.

    Ranks reading the same cores count those cores once (the median of their readings)."""
    if not windows or any(w is None or w.busy_seconds is None or w.wall_seconds <= 0 for w in windows):
        return None
    by_cpus: dict[tuple[int, ...], list[float]] = {}
    for w in windows:
        by_cpus.setdefault(w.cpus, []).append(w.busy_seconds / w.wall_seconds)
    busy = sum(statistics.median(v) for v in by_cpus.values())
    own = sum(w.process_seconds / w.wall_seconds for w in windows)
    cores = len({c for cpus in by_cpus for c in cpus})
    return max(0.0, busy - own), cores


def busy_host_message(label: str, load: tuple[float, int] | None) -> str | None:
    """A warning text when other work (other_load) used more than max(1 core, 10% of the cores) during timing."""
    if load is None:
        return None
    other, cores = load
    if other <= max(OTHER_LOAD_FLOOR_CORES, OTHER_LOAD_FRACTION * cores):
        return None
    return (f"{label}: other work kept {other:.1f} of the job's {cores} cores busy while its steps were timed; "
            f"its step times are likely inflated (run on a quiet machine, or look for builds, other jobs, "
            f"data loaders)")


from pytest_distperf.errors import HostBusyWarning  # noqa: E402  (re-exported: the hostload API names it)
