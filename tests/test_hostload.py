"""The busy-host check: arithmetic on fixed readings, and a real reading under real load."""

import multiprocessing as mp
import os
import time

import pytest

from pytest_distperf.rank import hostload
from pytest_distperf.rank.hostload import CpuMeter, CpuWindow, busy_host_message, other_load, parse_proc_stat

STAT = """cpu  400 0 200 9000 100 0 0 0 0 0
cpu0 100 0 50 4500 50 0 0 0 0 0
cpu1 300 0 150 4500 50 0 0 5 0 0
intr 12345
"""


def test_busy_jiffies_leave_out_idle_and_iowait_and_count_only_the_given_cores():
    assert parse_proc_stat(STAT, (0,)) == 150
    assert parse_proc_stat(STAT, (1,)) == 455  # steal counts: another guest had the core
    assert parse_proc_stat(STAT, (0, 1)) == 605


def test_other_load_counts_shared_cores_once_and_pinned_slices_each():
    # CUDA-style: both ranks may use cores 0-3 and read them; 3.0 busy, the ranks used 1.0 + 0.5
    shared = [CpuWindow(2.0, 2.0, (0, 1, 2, 3), 6.0), CpuWindow(2.0, 1.0, (0, 1, 2, 3), 6.2)]
    assert other_load(shared) == (pytest.approx(3.05 - 1.5), 4)
    # CPU-style: each rank pinned to its own core; each core's busy time adds up
    pinned = [CpuWindow(1.0, 0.9, (0,), 1.0), CpuWindow(1.0, 0.1, (1,), 1.0)]
    assert other_load(pinned) == (pytest.approx(1.0), 2)
    assert other_load([CpuWindow(1.0, 0.9, (0,), 1.0), None]) is None
    assert other_load([CpuWindow(1.0, 0.9)]) is None  # off Linux: no busy reading, nothing said


def _message(label, windows):
    return busy_host_message(label, other_load(windows))


def test_the_warning_needs_more_than_a_core_or_a_tenth_of_the_cores():
    two_cores = [CpuWindow(1.0, 0.5, (0,), 1.0), CpuWindow(1.0, 0.4, (1,), 1.0)]  # 1.1 cores of other work
    assert "1.1 of the job's 2 cores" in _message("ddp tiny x2 cpu", two_cores)
    assert _message("ddp", [CpuWindow(1.0, 0.2, (0,), 1.0), CpuWindow(1.0, 0.9, (1,), 1.0)]) is None
    wide = [CpuWindow(1.0, 14.0, tuple(range(32)), 17.0)]  # 3 of 32 cores: below 10%
    assert _message("fsdp2", wide) is None
    assert "4.0 of the job's 32" in _message("fsdp2", [CpuWindow(1.0, 14.0, tuple(range(32)), 18.0)])


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _quietest_core(cores: set[int]) -> int:
    """The allowed core that other work used least over a short look (a shared CI host is rarely idle)."""
    meters = {}
    for core in sorted(cores):
        meters[core] = CpuMeter()
        meters[core].cpus = (core,)
        meters[core].start()
    time.sleep(0.3)
    return min(meters, key=lambda c: meters[c].stop().busy_seconds)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="reads /proc/stat and CPU affinity (Linux)")
def test_a_real_reading_sees_another_process_spinning_and_not_our_own_work():
    before = os.sched_getaffinity(0)
    core = _quietest_core(before)
    meter = CpuMeter()
    meter.cpus = (core,)  # read one core; pin ourselves and a spinner to it
    os.sched_setaffinity(0, {core})
    try:
        meter.start()
        time.sleep(0.6)  # the host's own load on this core, with us idle
        host = meter.stop()
        meter.start()
        _spin(0.6)  # our own work: not "other"
        ours = meter.stop()
        ctx = mp.get_context("spawn")
        spinner = ctx.Process(target=_spin, args=(3.0,))
        spinner.start()
        time.sleep(0.5)  # let it start (the spinner is the work being measured, not a stand-in)
        meter.start()
        _spin(1.0)
        busy = meter.stop()
        spinner.join()
    finally:
        os.sched_setaffinity(0, before)
    # Our spinning is subtracted: what is left is the host's own load, which only gets less of the core while we
    # spin. Counted as "other", our work would read a whole core.
    assert other_load([ours])[0] < other_load([host])[0] + 0.3
    assert other_load([busy])[0] > 0.3  # the spinner shared the core with us
    assert isinstance(hostload.HostBusyWarning("x"), UserWarning)
