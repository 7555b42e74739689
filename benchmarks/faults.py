"""Fault figures: time from fault to failed job for each kind of fault, and processes left behind.

Each fault is injected in rank 1 of a 2-rank job (rank 0 waits in a barrier) at a known moment;
the figure is the time from that moment to the launcher's verdict.

    python benchmarks/faults.py [--device cpu|cuda] [--repeat 3] [--parallel 0]
    --parallel N: additionally start N empty launches, 4 at a time, and count rendezvous failures.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
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
from pytest_distperf.spec import FunctionRef, JobSpec  # noqa: E402

MODULE = "distperf_faults_bench"


def _fault_at(path: str) -> None:
    with open(path, "w") as f:
        f.write(repr(time.time()))


def inject(kind: str, stamp: str) -> int:
    import torch
    import torch.distributed as dist

    dist.barrier()
    if dist.get_rank() == 1:
        _fault_at(stamp)
        if kind == "raise":
            raise ValueError("injected")
        if kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "abort":
            os.abort()
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
    return dist.get_rank()


def empty() -> int:
    return 0


def descendants_alive() -> int:
    return len(psutil.Process().children(recursive=True))


def one(kind: str, device: str, timeout: float) -> tuple[float, str]:
    stamp = tempfile.mktemp()
    job = JobSpec(world_size=2, device=device, function=FunctionRef(MODULE, "inject", __file__),
                  args=(kind, stamp), sys_path=[str(ROOT)])
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
    with open(stamp) as f:
        t_fault = float(f.read())
    os.unlink(stamp)
    return end - t_fault, verdict


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--hang-timeout", type=float, default=20.0)
    p.add_argument("--kinds", default="raise,sigkill,abort,exit0,skip,hang" )
    p.add_argument("--parallel", type=int, default=0)
    a = p.parse_args()
    kinds = a.kinds.split(",")
    print(f"fault -> verdict, 2 ranks, {a.device}, median of {a.repeat} (hang: job timeout {a.hang_timeout:g} s)")
    for kind in kinds:
        times, verdict = [], ""
        for _ in range(a.repeat):
            seconds, verdict = one(kind, a.device, a.hang_timeout if kind == "hang" else 300)
            times.append(seconds)
        print(f"  {kind:8s} {statistics.median(times):6.2f} s  (max {max(times):.2f})  processes left: "
              f"{descendants_alive()}  -> {verdict}")
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


if __name__ == "__main__":
    main()
