"""Overhead of the harness, printed as figures.

1. Fixed cost per job: pytest-distperf's launch (agent process, elastic_launch, spawn, process group
   init and teardown, result collection) of ranks running an empty function, beside a bare
   `elastic_launch` of the same number of ranks running an empty function, started the way torchrun
   starts it (a fresh Python process). Target: <= 1.2x.
2. Step time added by the instrumentation: inside each rank, the instrumented timing loop of
   worker.run_strategy (StepTimer around each step, loss kept) against an uninstrumented loop over
   the same steps, interleaved. Target: <= 1 %.

    python benchmarks/overhead.py [--device cpu|cuda] [--world-size 2] [--launches 5] [--rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_distperf.launch.launcher import launch  # noqa: E402
from pytest_distperf.spec import FunctionRef, JobSpec  # noqa: E402

THIS = FunctionRef(module="distperf_overhead_bench", qualname="", file=__file__)


def empty() -> None:
    return None


def loops(shape: str, steps: int, rounds: int) -> dict:
    """In each rank: plain loop vs the worker's instrumented loop over the same batches, interleaved."""
    import os

    import torch

    from pytest_distperf import strategies
    from pytest_distperf.strategies import RankContext
    from pytest_distperf.rank.timing import StepTimer
    from pytest_distperf.rank.workload import build_model, make_batches, resolve_shape

    rank = int(os.environ["RANK"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")
    s = resolve_shape(shape)
    ctx = RankContext(rank=rank, local_rank=int(os.environ["LOCAL_RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                      device=device, micro_batch=s.micro_batch, scratch_dir="/tmp")
    trainer = strategies.build("ddp", build_model(s, 0, device), ctx, strategies.validate("ddp", {}))
    batches = make_batches(s, 0, rank, steps, device)
    timer = StepTimer(device)
    for b in batches[:3]:
        trainer.step(*b)
    def plain_loop() -> float:
        timer.sync()
        t0 = time.perf_counter()
        for b in batches:
            trainer.step(*b)
        timer.sync()
        return (time.perf_counter() - t0) / steps

    def instrumented_loop() -> float:
        t0 = time.perf_counter()
        times, losses = [], []
        for b in batches:  # the worker's timing loop
            loss, seconds = timer.time(lambda b=b: trainer.step(*b))
            times.append(seconds)
            losses.append(loss)
        [float(x) for x in losses]
        return (time.perf_counter() - t0) / steps

    plain, instrumented = [], []
    for i in range(rounds):  # ABBA order, so an order effect cancels
        if i % 2 == 0:
            plain.append(plain_loop())
            instrumented.append(instrumented_loop())
        else:
            instrumented.append(instrumented_loop())
            plain.append(plain_loop())
    return {"plain": plain, "instrumented": instrumented}


BARE = textwrap.dedent("""
    import sys, uuid
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch
    sys.path.insert(0, {root!r})
    from benchmarks.overhead import empty
    if __name__ == "__main__":
        cfg = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node={ws}, run_id=uuid.uuid4().hex, rdzv_backend="c10d",
                           rdzv_endpoint="127.0.0.1:0", max_restarts=0, monitor_interval=0.1, start_method="spawn")
        elastic_launch(cfg, empty)()
""")


def time_bare(ws: int) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", BARE.format(root=str(ROOT), ws=ws)], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def time_harness(ws: int, device: str) -> float:
    job = JobSpec(world_size=ws, device=device, function=FunctionRef(THIS.module, "empty", THIS.file),
                  sys_path=[str(ROOT)])
    start = time.perf_counter()
    launch(job, timeout=300)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--launches", type=int, default=5)
    p.add_argument("--shape", default=None, help="workload shape for the loop test (tiny on cpu, 350m on cuda)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=6)
    a = p.parse_args()

    bare, harness = [], []
    time_bare(a.world_size)  # warm the page cache for both
    for _ in range(a.launches):  # interleaved so drift hits both alike
        bare.append(time_bare(a.world_size))
        harness.append(time_harness(a.world_size, a.device))
    mb, mh = statistics.median(bare), statistics.median(harness)
    print(f"fixed cost per job, {a.world_size} ranks, {a.device}, median of {a.launches}:")
    print(f"  bare elastic_launch (fresh python, empty fn): {mb:6.2f} s   (runs: {', '.join(f'{x:.2f}' for x in bare)})")
    print(f"  pytest-distperf launch (empty fn):            {mh:6.2f} s   (runs: {', '.join(f'{x:.2f}' for x in harness)})")
    print(f"  ratio harness / bare: {mh / mb:.3f}  (target <= 1.2)")

    shape = a.shape or ("350m" if a.device == "cuda" else "tiny")
    job = JobSpec(world_size=a.world_size, device=a.device, function=FunctionRef(THIS.module, "loops", THIS.file),
                  args=(shape, a.steps, a.rounds), sys_path=[str(ROOT)])
    values = launch(job, timeout=1800)
    plain = [statistics.median(v["plain"]) for v in values.values()]
    inst = [statistics.median(v["instrumented"]) for v in values.values()]
    ratios = [statistics.median(i / p for i, p in zip(v["instrumented"], v["plain"])) for v in values.values()]
    print(f"step time added by instrumentation ({shape}, ddp, {a.steps} steps x {a.rounds} interleaved rounds):")
    for r, (pl, ins, ra) in enumerate(zip(plain, inst, ratios)):
        print(f"  rank {r}: plain {pl * 1e3:8.2f} ms/step, instrumented {ins * 1e3:8.2f} ms/step, "
              f"added {100 * (ra - 1):+.2f} %")
    print(f"  worst rank: {100 * (max(ratios) - 1):+.2f} %  (target <= 1 %)")


if __name__ == "__main__":
    main()
