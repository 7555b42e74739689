"""Fault figures: time from fault to failed job for each kind of fault, and processes left behind.

Each fault is injected in rank 1 of a 2-rank job (rank 0 waits in a barrier) at a known moment;
the figure is the time from that moment to the launcher's verdict. Kinds run round-robin (one run of
each kind per round), so a busy moment of the machine spreads over all kinds instead of hitting one.

    python benchmarks/faults.py [--device cpu|cuda] [--runs 3] [--within 30] [--json PATH]
                                [--core-dumps] [--rank-memory-gib G] [--parallel 0]

--core-dumps: raise this process's soft core-file limit to its hard limit first (what a shell with
  `ulimit -c unlimited`, or a container runtime's default, gives the ranks), and count the core files
  the ranks leave in the working directory. A rank's core is written before its exit is reported,
  so a core's size is time added to every crash report.
--rank-memory-gib G: the faulting rank holds G GiB (touched) when it faults: the size of its core.
--parallel N: additionally start N empty launches, 4 at a time, and count rendezvous failures.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import resource
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_distperf.launch.launcher import JobError, RankOutcome, launch  # noqa: E402
from pytest_distperf.spec.job import FunctionRef, JobSpec  # noqa: E402

MODULE = "distperf_faults_bench"
KINDS = ("raise", "sigkill", "abort", "segfault", "exit0", "skip", "hang")


def _fault_at(path: str) -> None:
    with open(path, "w") as f:
        f.write(repr(time.time()))


def inject(kind: str, stamp: str, memory_gib: float = 0.0) -> int:
    import torch
    import torch.distributed as dist

    hold = None
    if dist.get_rank() == 1 and memory_gib > 0:
        hold = bytearray(int(memory_gib * (1 << 30)))
        hold[::4096] = b"\x01" * len(range(0, len(hold), 4096))  # touch every page: it is in a core
    dist.barrier()
    if dist.get_rank() == 1:
        _fault_at(stamp)
        if kind == "raise":
            raise ValueError("injected")
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "abort":
            os.abort()
        if kind == "segfault":
            import ctypes

            ctypes.string_at(0)
        if kind == "hang":
            time.sleep(3600)
        if kind == "exit0":
            os._exit(0)
        if kind == "skip":
            import pytest

            pytest.skip("skipped in rank 1")
        if kind == "cuda_oom":
            torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB
    dist.barrier()
    del hold
    return dist.get_rank()


def empty() -> int:
    return 0


def descendants_alive() -> int:
    return len(psutil.Process().children(recursive=True))


def cores_since(folder: str, since: float) -> int:
    """Core files in `folder` written since `since` (core_pattern `core` reuses one name: count by time)."""
    return sum(1 for path in glob.glob(os.path.join(folder, "core*")) if os.path.getmtime(path) >= since)


def one(kind: str, device: str, timeout: float, memory_gib: float) -> tuple[float, str]:
    fd, stamp = tempfile.mkstemp(prefix="distperf-fault-")
    os.close(fd)
    os.unlink(stamp)  # the rank creates it at the moment of the fault
    job = JobSpec(world_size=2, device=device, function=FunctionRef(MODULE, "inject", __file__),
                  args=(kind, stamp, memory_gib), sys_path=[str(ROOT)])
    try:
        launch(job, timeout=timeout)
        verdict = "PASSED (wrong)"
    except RankOutcome as e:
        verdict = f"{e.outcome}: {e.reason}"
    except JobError as e:
        verdict = str(e).splitlines()[0][:110]
        if kind == "cuda_oom":
            verdict = next((ln.strip() for ln in str(e).splitlines() if "CUDA out of memory on rank" in ln), verdict)[:200]
    end = time.time()
    try:
        with open(stamp) as f:
            t_fault = float(f.read())
        os.unlink(stamp)
    except FileNotFoundError:  # the job failed before the fault: no figure
        return float("nan"), f"no fault injected: {verdict}"
    return end - t_fault, verdict


def allow_core_dumps() -> str:
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    shown = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    try:
        with open("/proc/sys/kernel/core_pattern") as f:
            pattern = f.read().strip()
    except OSError:
        pattern = "?"
    return f"core-file limit raised to {shown} (was {soft}); core_pattern {pattern!r}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--runs", "--repeat", dest="runs", type=int, default=3, help="runs per fault kind")
    p.add_argument("--within", type=float, default=30.0, help="count the runs reported within this many seconds")
    p.add_argument("--hang-timeout", type=float, default=20.0)
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}, cuda_oom")
    p.add_argument("--core-dumps", action="store_true")
    p.add_argument("--rank-memory-gib", type=float, default=0.0)
    p.add_argument("--json", help="write every run's figure here")
    p.add_argument("--parallel", type=int, default=0)
    a = p.parse_args(argv)
    kinds = a.kinds.split(",")
    print(f"fault -> verdict, 2 ranks, {a.device}, {a.runs} run(s) per kind, round-robin "
          f"(hang: job timeout {a.hang_timeout:g} s); faulting rank holds {a.rank_memory_gib:g} GiB extra")
    if a.core_dumps:
        print("  " + allow_core_dumps())
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    started = time.time()
    for i in range(a.runs):
        for kind in kinds:
            run_start = time.time()
            seconds, verdict = one(kind, a.device, a.hang_timeout if kind == "hang" else 300, a.rank_memory_gib)
            left = descendants_alive()
            cores = cores_since(os.getcwd(), run_start)
            runs[kind].append({"seconds": seconds, "verdict": verdict, "processes_left": left, "core_files": cores})
            print(f"  [{i + 1}/{a.runs}] {kind:8s} {seconds:6.2f} s  left {left}  {verdict[:70]}", file=sys.stderr,
                  flush=True)
    print(f"figures ({time.time() - started:.0f} s in all):")
    worst_ok = True
    for kind, rs in runs.items():
        times = [r["seconds"] for r in rs]
        within = sum(1 for t in times if t == t and t <= a.within)
        left = max(r["processes_left"] for r in rs)
        worst_ok &= within == len(rs) and left == 0
        print(f"  {kind:8s} median {statistics.median(times):6.2f} s  max {max(times):6.2f} s  within {a.within:g} s: "
              f"{within}/{len(rs)}  processes left: {left}  core files: {sum(r['core_files'] for r in rs)}  "
              f"-> {rs[-1]['verdict']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": a.device, "runs": a.runs, "within": a.within, "core_dumps": a.core_dumps,
                       "rank_memory_gib": a.rank_memory_gib, "figures": runs}, f, indent=2)
    if a.parallel:
        job = JobSpec(world_size=2, device="cpu", function=FunctionRef(MODULE, "empty", __file__), sys_path=[str(ROOT)])
        failures = 0
        start = time.time()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            for fut in [pool.submit(launch, job, timeout=600) for _ in range(a.parallel)]:
                try:
                    fut.result()
                except Exception as e:  # noqa: BLE001 - counted and shown
                    failures += 1
                    print("  launch failed:", str(e).splitlines()[0])
        print(f"parallel launches: {a.parallel} (4 at a time) in {time.time() - start:.0f} s, failures: {failures}, "
              f"processes left: {descendants_alive()}")
    return 0 if worst_ok else 1


if __name__ == "__main__":
    sys.exit(main())
