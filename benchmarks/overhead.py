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
4. Fixed cost per job, fresh agent vs warm agent (agents/warm.py): interleaved launches of ranks running an
   empty function, and of a real small strategy job (ddp on the tiny shape, a few steps), each with a new agent
   process (fresh_agent=True, as -o distperf_fresh_agent=true) and forked from the warm agent (the default; its one-time
   start is printed apart). For the strategy job also its start-up: launch to the build's start
   (figures/quantities.run_time_split). Target (issue #32): <= 1.5 s a job on the 2-core box, <= 3 s plus the engine
   build on one GPU.
3. The work phase's cost (rank/work.py): interleaved real strategy jobs with the work phase (JobSpec.work_steps,
   the default) and without it (work_steps=0): the seconds it adds per job, and the timed steps' median on both
   sides (they run before it, so they must not differ beyond the runs' own spread).

5. Fixed cost per job across the tests of one pytest session (`--session-tests N`): a session of N tests of each
   kind, interleaved (run_function of an empty function; distperf.run of a job(): ddp tiny, 1+5 steps; distperf.run
   of a step_job(): a tiny Linear's step, 1+5 steps), each test timing its own job; printed: each kind's wall per job
   (median over its N tests, and without the session's first job, which starts the warm agent), the start-up of
   job() and step_job() runs (launch to the build), and the session's "N warm agent(s) served M job(s)" (issue #45:
   a warm agent keyed on PYTEST_CURRENT_TEST served one test each). `--session-fresh-agent` runs the session with
   -o distperf_fresh_agent=true. `--session-tests` alone runs only this part.

    python benchmarks/overhead.py [--device cpu|cuda] [--world-size 2] [--launches 5] [--rounds 8]
    python benchmarks/overhead.py --device cuda --world-size 1 --launches 0 --shape 1b   # loops only
    python benchmarks/overhead.py --agents 8 --launches 0 --work-jobs 0 --rounds 0 --json out.json  # agents only
    python benchmarks/overhead.py --session-tests 6 --json out.json  # one session's tests only
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
    from pytest_distperf.strategies import RankContext, ddp

    rank = int(os.environ["RANK"])
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")
    s = resolve_shape(shape)
    ctx = RankContext(rank=rank, local_rank=int(os.environ["LOCAL_RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                      device=device, micro_batch=s.micro_batch, scratch_dir="/tmp")
    trainer = ddp.build(build_model(s, 0, device), ctx, **strategies.validate("ddp", {}))
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
    from pytest_distperf.figures.quantities import run_time_split
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


SESSION_TESTS = textwrap.dedent("""
    import json, os, time
    import pytest

    def empty():
        return None

    def make_step():
        import torch

        model = torch.nn.Linear(64, 64)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.ones(8, 64)

        def step():
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss.detach()
        return step

    def record(kind, i, wall, run=None):
        from pytest_distperf.figures.quantities import run_time_split

        split = run_time_split(run) if run is not None else None
        with open(os.environ["DISTPERF_SESSION_FIGURES"], "a") as f:
            f.write(json.dumps({{"kind": kind, "test": i, "wall": wall,
                                "startup": split["startup"] if split else None}}) + "\\n")

    @pytest.mark.parametrize("kind", ["run_function", "job", "step_job"])
    @pytest.mark.parametrize("i", range({n}))
    def test_one_job(distperf, kind, i):
        start = time.perf_counter()
        if kind == "run_function":
            distperf.run_function(empty)
            run = None
        elif kind == "job":
            run = distperf.run(distperf.job("ddp", shape="tiny", steps=5, warmup=1))
        else:
            run = distperf.run(distperf.step_job(make_step, steps=5, warmup=1))
        wall = run.wall_seconds - run.slot_wait_seconds if run is not None else time.perf_counter() - start
        record(kind, i, wall, run)
""")


def session_cost(a: argparse.Namespace) -> dict:
    """One pytest session of N tests of each kind (run_function, job(), step_job()), interleaved; each test's job
    timed in the test; the session's warm-agent count from its summary."""
    import json
    import os
    import re
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="distperf-session-bench-"))
    # parametrize's order: test 0 of each kind, then test 1 of each... -- the kinds interleave over the session
    (folder / "test_session_jobs.py").write_text(SESSION_TESTS.format(n=a.session_tests))
    (folder / "pytest.ini").write_text("[pytest]\n")
    figures_file = folder / "figures.jsonl"
    env = {**os.environ, "DISTPERF_SESSION_FIGURES": str(figures_file), "DISTPERF_LOCK_DIR": str(folder / "locks"),
           "PYTHONPATH": os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)}
    env.pop("PYTEST_CURRENT_TEST", None)
    args = [sys.executable, "-m", "pytest", "--distperf", "-p", "no:cacheprovider", "-q", "-s",
            "--distperf-device", a.device, "--distperf-world-size", str(a.world_size), "test_session_jobs.py"]
    if a.session_fresh_agent:
        args += ["-o", "distperf_fresh_agent=true"]
    started = time.perf_counter()
    proc = subprocess.run(args, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    session_wall = time.perf_counter() - started
    agents = re.search(r"(\d+) warm agent\(s\) served (\d+) job\(s\)", proc.stdout)
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        raise SystemExit(f"the session failed (exit {proc.returncode}); its folder: {folder}")
    rows = [json.loads(line) for line in figures_file.read_text().splitlines()]
    import shutil

    shutil.rmtree(folder, ignore_errors=True)
    first = 0  # the session's first job started the warm agent
    out: dict = {"session_wall_seconds": session_wall, "tests": len(rows),
                 "warm_agents": int(agents.group(1)) if agents else 0,
                 "warm_agent_jobs": int(agents.group(2)) if agents else 0,
                 "fresh_agent": a.session_fresh_agent, "jobs": {}}
    mode = "fresh agents" if a.session_fresh_agent else "warm agent"
    print(f"fixed cost per job across one session's tests ({a.session_tests} tests of each kind, interleaved; "
          f"{a.world_size} ranks, {a.device}, {mode}): session {session_wall:.1f} s")
    for kind in ("run_function", "job", "step_job"):
        mine = [(k, r) for k, r in enumerate(rows) if r["kind"] == kind]
        walls = [r["wall"] for _, r in mine]
        later = [r["wall"] for k, r in mine if k != first]
        startups = [r["startup"] for _, r in mine if r["startup"] is not None]
        out["jobs"][kind] = {"wall": walls, "startup": startups, "wall_without_first_job": later}
        text = (f"  {kind:12s}: wall {statistics.median(walls):5.2f} s a job (runs {min(walls):.2f}-{max(walls):.2f})"
                f", without the session's first job {statistics.median(later):5.2f} s")
        if startups:
            text += f", start-up {statistics.median(startups):.2f} s (launch to build)"
        print(text)
    print(f"  agent: {agents.group(0) if agents else 'no warm agent'}")
    return out


def work_phase_cost(a: argparse.Namespace) -> None:
    from pytest_distperf.figures.quantities import run_step_time
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
    p.add_argument("--session-tests", type=int, default=0,
                   help="N tests of each job kind in one pytest session (run_function, job(), step_job()); "
                        "given alone, only this part runs")
    p.add_argument("--session-fresh-agent", action="store_true", help="that session with -o distperf_fresh_agent=true")
    p.add_argument("--json", default=None, help="write the fresh-vs-warm (or the session's) figures here")
    a = p.parse_args()

    if a.session_tests > 0:
        figures = session_cost(a)
        if a.json:
            import json
            import os

            figures["args"] = vars(a)
            figures["cores"] = len(os.sched_getaffinity(0))
            Path(a.json).write_text(json.dumps(figures, indent=1))
        given = {x.split("=")[0] for x in sys.argv[1:] if x.startswith("--")}
        if not given & {"--agents", "--launches", "--work-jobs", "--rounds"}:
            return
        a.json = None  # the session's figures are written; the fresh-vs-warm part prints only

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
