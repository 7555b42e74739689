"""Overhead of the harness, printed as figures.

1. Fixed cost per job: pytest-distperf's launch (agent process, elastic_launch, spawn, process group
   init and teardown, result collection) of ranks running an empty function, beside a bare
   `elastic_launch` of the same number of ranks running an empty function, started the way torchrun
   starts it (a fresh Python process). Target: <= 1.2x.
2. Step time added by the instrumentation: inside each rank, the worker's timed window (rank/worker.py:
   the step timer -- CUDA events, one synchronisation at the end --, the CPU meter, the GPU clock sampler,
   the losses kept) against an untimed loop over the same steps (one synchronisation before and after),
   in interleaved rounds (ABBA, so an order effect cancels). Both loops are measured the same way, as wall
   time from a synchronised start to a synchronised end. Target: <= 1 %. Also printed: what the timer
   reports (median step) against the untimed loop's wall time per step (its accuracy).
4. Fixed cost per job, fresh agent vs warm agent (rank/warm_agent.py): interleaved launches of ranks running an
   empty function, and of a real small strategy job (ddp on the tiny shape, a few steps), each with a new agent
   process (fresh_agent=True, as --distperf-fresh-agent) and forked from the warm agent (the default; its one-time
   start is printed apart). For the strategy job also its start-up: launch to the build's start
   (measure/figures.run_time_split). Target (issue #32): <= 1.5 s a job on the 2-core box, <= 3 s plus the engine
   build on one GPU.
3. The work phase's cost (rank/work.py): interleaved real strategy jobs with the work phase (JobSpec.work_steps,
   the default) and without it (work_steps=0): the seconds it adds per job, and the timed steps' median on both
   sides (they run before it, so they must not differ beyond the runs' own spread).

    python benchmarks/overhead.py [--device cpu|cuda] [--world-size 2] [--launches 5] [--rounds 8]
    python benchmarks/overhead.py --device cuda --world-size 1 --launches 0 --shape 1b   # loops only
    python benchmarks/overhead.py --agents 8 --launches 0 --work-jobs 0 --rounds 0 --json out.json  # agents only
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
from pytest_distperf.spec.job import FunctionRef, JobSpec  # noqa: E402

THIS = FunctionRef(module="distperf_overhead_bench", qualname="", file=__file__)


def empty() -> None:
    return None


def loops(shape: str, steps: int, rounds: int) -> dict:
    """In each rank: the untimed loop vs the worker's timed window over the same batches, interleaved."""
    import os

    import torch

    from pytest_distperf import strategies
    from pytest_distperf.rank.clocks import ClockSampler
    from pytest_distperf.rank.hostload import CpuMeter
    from pytest_distperf.rank.timing import StepTimer
    from pytest_distperf.rank.workload import build_model, make_batches, resolve_shape
    from pytest_distperf.strategies import RankContext

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
    timer.sync()

    def untimed_loop() -> tuple[float, None]:
        timer.sync()
        t0 = time.perf_counter()
        for b in batches:
            trainer.step(*b)
        timer.sync()
        return (time.perf_counter() - t0) / steps, None

    def timed_loop() -> tuple[float, float]:
        # Made before the clock starts, as the worker makes them before its timed steps (NVML's init takes
        # tens of ms once per job); everything from the window on is inside the measured wall time.
        cpu, clocks = CpuMeter(), ClockSampler.for_device(device)
        timer.sync()
        t0 = time.perf_counter()
        losses = []
        window = timer.window(steps)
        cpu.start()
        if clocks:
            clocks.start()
        for b in batches:
            losses.append(window.time(lambda b=b: trainer.step(*b)))
        times = window.finish()
        if clocks:
            clocks.stop()
        cpu.stop()
        timer.sync()
        wall = (time.perf_counter() - t0) / steps
        [float(x) for x in losses]  # the worker reads the losses after timing
        return wall, statistics.median(times)

    untimed, timed, reported = [], [], []
    for i in range(rounds):  # ABBA order, so an order effect cancels
        order = (untimed_loop, timed_loop) if i % 2 == 0 else (timed_loop, untimed_loop)
        for loop in order:
            wall, median = loop()
            if median is None:
                untimed.append(wall)
            else:
                timed.append(wall)
                reported.append(median)
    return {"untimed": untimed, "timed": timed, "reported": reported}


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


def time_job(job: JobSpec, fresh_agent: bool) -> tuple[float, float | None]:
    """(wall seconds of one launch, its start-up: launch to the latest rank's build start; None for a function)."""
    from pytest_distperf.measure.figures import run_time_split
    from pytest_distperf.rank.results import RunResult

    launched = time.time()
    start = time.perf_counter()
    values = launch(job, timeout=600, fresh_agent=fresh_agent)
    wall = time.perf_counter() - start
    if job.function is not None:
        return wall, None
    run = RunResult(spec=job, ranks=[values[r] for r in sorted(values)], wall_seconds=wall, launched_at=launched)
    split = run_time_split(run)
    return wall, split["startup"] if split else None


def agent_cost(a: argparse.Namespace) -> dict:
    """Fresh vs warm agent, interleaved (ABBA), for an empty function and a small ddp job."""
    from pytest_distperf.launch import warm_pool

    jobs = {"empty function": JobSpec(world_size=a.world_size, device=a.device, sys_path=[str(ROOT)],
                                      function=FunctionRef(THIS.module, "empty", THIS.file)),
            "ddp tiny": JobSpec(world_size=a.world_size, device=a.device, strategy="ddp", shape=a.shape or "tiny",
                                steps=5, warmup_steps=1, work_steps=0, sys_path=[str(ROOT)])}
    started = time.perf_counter()
    launch(jobs["empty function"], timeout=600)  # starts the warm agent: its one-time cost
    agent_start = time.perf_counter() - started
    out: dict = {"warm_agent_start_seconds": agent_start, "preload_seconds": warm_pool.STATE.preload_seconds,
                 "preloaded": warm_pool.STATE.preloaded, "jobs": {}}
    print(f"fixed cost per job, fresh vs warm agent ({a.world_size} ranks, {a.device}, {a.agents} launches a side, "
          f"interleaved ABBA):")
    print(f"  warm agent start (imports {', '.join(m for m in warm_pool.STATE.preloaded if '.' not in m)}; "
          f"once a session): {agent_start:.2f} s with its first job")
    for device, why in warm_pool.STATE.refused.items():
        print(f"  no warm agent for {device} jobs (both sides below are fresh): {why}")
    out["refused"] = dict(warm_pool.STATE.refused)
    for name, job in jobs.items():
        sides: dict[str, list[tuple[float, float | None]]] = {"fresh": [], "warm": []}
        for i in range(a.agents):
            for side in (("fresh", "warm") if i % 2 == 0 else ("warm", "fresh")):
                sides[side].append(time_job(job, fresh_agent=side == "fresh"))
        record = {}
        for side, runs in sides.items():
            walls = [w for w, _ in runs]
            startups = [s for _, s in runs if s is not None]
            record[side] = {"wall": walls, "startup": startups}
            text = (f"  {name:15s} {side:5s}: wall {statistics.median(walls):6.2f} s (runs {min(walls):.2f}-"
                    f"{max(walls):.2f})")
            if startups:
                text += f", start-up {statistics.median(startups):.2f} s (launch to build)"
            print(text)
        fresh_wall, warm_wall = (statistics.median(record[s]["wall"]) for s in ("fresh", "warm"))
        print(f"  {name:15s} saved a job: {fresh_wall - warm_wall:.2f} s ({warm_wall / fresh_wall:.2f}x the fresh wall)")
        out["jobs"][name] = record
    return out


def work_phase_cost(a: argparse.Namespace) -> None:
    from pytest_distperf.measure.figures import run_step_time
    from pytest_distperf.rank.results import RunResult

    shape = a.shape or ("350m" if a.device == "cuda" else "tiny")
    sides: dict[int, tuple[list[float], list[float]]] = {0: ([], []), 2: ([], [])}
    for i in range(a.work_jobs):
        for work_steps in ((2, 0) if i % 2 else (0, 2)):  # ABBA
            job = JobSpec(world_size=a.world_size, device=a.device, strategy="ddp", shape=shape, steps=a.steps,
                          work_steps=work_steps, sys_path=[str(ROOT)])
            start = time.perf_counter()
            values = launch(job, timeout=600)
            wall = time.perf_counter() - start
            run = RunResult(spec=job, ranks=[values[r] for r in sorted(values)], wall_seconds=wall)
            sides[work_steps][0].append(wall)
            sides[work_steps][1].append(run_step_time(run))
    (w0, s0), (w2, s2) = sides[0], sides[2]
    print(f"work phase cost (ddp {shape}, {a.world_size} rank(s), {a.device}, {a.work_jobs} jobs a side, ABBA):")
    print(f"  job wall time without / with: {statistics.median(w0):.2f} s / {statistics.median(w2):.2f} s "
          f"(+{statistics.median(w2) - statistics.median(w0):.2f} s a job)")
    print(f"  timed step median without / with: {statistics.median(s0) * 1e3:.2f} ms / "
          f"{statistics.median(s2) * 1e3:.2f} ms (runs {min(s0) * 1e3:.1f}-{max(s0) * 1e3:.1f} / "
          f"{min(s2) * 1e3:.1f}-{max(s2) * 1e3:.1f} ms)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--launches", type=int, default=5, help="launches per side; 0 skips the launch cost")
    p.add_argument("--shape", default=None, help="workload shape for the loop test (tiny on cpu, 350m on cuda)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--work-jobs", type=int, default=4, help="job pairs with and without the work phase; 0 skips")
    p.add_argument("--agents", type=int, default=6, help="launches a side, fresh vs warm agent; 0 skips")
    p.add_argument("--json", default=None, help="write the fresh-vs-warm figures here")
    a = p.parse_args()

    if a.agents > 0:
        figures = agent_cost(a)
        if a.json:
            import json
            import os

            figures["args"] = vars(a)
            figures["cores"] = len(os.sched_getaffinity(0))
            Path(a.json).write_text(json.dumps(figures, indent=1))

    if a.work_jobs > 0:
        work_phase_cost(a)

    if a.launches > 0:
        bare, harness = [], []
        time_bare(a.world_size)  # warm the page cache for both
        for _ in range(a.launches):  # interleaved so drift hits both alike
            bare.append(time_bare(a.world_size))
            harness.append(time_harness(a.world_size, a.device))
        mb, mh = statistics.median(bare), statistics.median(harness)
        print(f"fixed cost per job, {a.world_size} ranks, {a.device}, median of {a.launches}:")
        print(f"  bare elastic_launch (fresh python, empty fn): {mb:6.2f} s   "
              f"(runs: {', '.join(f'{x:.2f}' for x in bare)})")
        print(f"  pytest-distperf launch (empty fn):            {mh:6.2f} s   "
              f"(runs: {', '.join(f'{x:.2f}' for x in harness)})")
        print(f"  ratio harness / bare: {mh / mb:.3f}  (target <= 1.2)")

    if a.rounds <= 0:
        return
    shape = a.shape or ("350m" if a.device == "cuda" else "tiny")
    job = JobSpec(world_size=a.world_size, device=a.device, function=FunctionRef(THIS.module, "loops", THIS.file),
                  args=(shape, a.steps, a.rounds), sys_path=[str(ROOT)])
    values = launch(job, timeout=1800)
    print(f"step time added by the timed window ({shape}, ddp, {a.world_size} rank(s), {a.device}, {a.steps} steps x "
          f"{a.rounds} interleaved rounds; wall time per step, median of the rounds):")
    worst = []
    for r, v in sorted(values.items()):
        ratios = [t / u for t, u in zip(v["timed"], v["untimed"])]
        added = statistics.median(ratios) - 1
        worst.append(added)
        untimed, reported = statistics.median(v["untimed"]), statistics.median(v["reported"])
        print(f"  rank {r}: untimed {untimed * 1e3:8.2f} ms/step, timed {statistics.median(v['timed']) * 1e3:8.2f} "
              f"ms/step, added {100 * added:+.2f} % (rounds {100 * (min(ratios) - 1):+.2f} .. "
              f"{100 * (max(ratios) - 1):+.2f} %)")
        print(f"          the timer reported {reported * 1e3:.2f} ms a step (median), "
              f"{100 * (reported / untimed - 1):+.2f} % of the untimed loop's wall time per step")
    print(f"  worst rank: {100 * max(worst):+.2f} %  (target <= 1 %)")


if __name__ == "__main__":
    main()
