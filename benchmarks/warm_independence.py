"""Is a run through the warm agent still an independent sample? An A/A of warm-agent vs fresh-agent runs of the
same job (agents/warm.py, issue #32).

The same job (ddp on the tiny shape, 2 CPU ranks by default) runs in interleaved pairs, one run forked from the
warm agent, one with a new agent process (as -o distperf_fresh_agent=true), the order alternating (ABBA), so drift hits
both sides alike. Printed:
- the warm/fresh ratio of the runs' step times (figures/quantities.run_step_time) with the gate's own paired interval
  (decide/decision.paired, its 98 % interval at the planned look the pairs reach): no systematic difference
  means the interval holds 1;
- the run-to-run spread of each side (sd of the log run step times, figures.run_cv's definition) and their ratio
  with a bootstrap interval over the pairs: a warm agent whose runs shared state would show a smaller spread, and a
  baseline recorded that way would understate the spread the gate then compares against;
- each side's wall time per run and start-up (launch to the build's start).

    python benchmarks/warm_independence.py [--pairs 12] [--strategy ddp] [--shape tiny] [--world-size 2]
                                           [--json benchmarks/results/warm-independence-cpu-2core.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_distperf.launch.launcher import launch  # noqa: E402
from pytest_distperf.decide.decision import Design, paired  # noqa: E402
from pytest_distperf.figures.quantities import run_step_time, run_time_split  # noqa: E402
from pytest_distperf.figures.stats import relative_spread  # noqa: E402
from pytest_distperf.rank.results import RunResult  # noqa: E402
from pytest_distperf.spec.job import JobSpec  # noqa: E402


def one_run(job: JobSpec, fresh_agent: bool) -> dict:
    launched = time.time()
    start = time.perf_counter()
    values = launch(job, timeout=600, fresh_agent=fresh_agent)
    wall = time.perf_counter() - start
    run = RunResult(spec=job, ranks=[values[r] for r in sorted(values)], wall_seconds=wall, launched_at=launched)
    split = run_time_split(run) or {}
    return {"step_time": run_step_time(run), "wall": wall, "startup": split.get("startup")}


def spread_ratio_interval(warm: list[float], fresh: list[float], draws: int = 4000,
                          seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap (95 %) of spread(warm) / spread(fresh), resampling the pairs."""
    rng = random.Random(seed)
    n = len(warm)
    ratios = []
    for _ in range(draws):
        idx = [rng.randrange(n) for _ in range(n)]
        w, f = relative_spread([warm[i] for i in idx]), relative_spread([fresh[i] for i in idx])
        if w is not None and f:
            ratios.append(w / f)
    ratios.sort()
    return ratios[int(0.025 * len(ratios))], ratios[int(0.975 * len(ratios)) - 1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=12)
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--shape", default="tiny")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.pairs < 12:
        p.error("--pairs: at least 12 for the A/A (issue #32)")

    job = JobSpec(world_size=a.world_size, device=a.device, strategy=a.strategy, shape=a.shape, steps=a.steps,
                  warmup_steps=3, work_steps=0, sys_path=[str(ROOT)])
    launch(job, timeout=600)  # starts the warm agent (its one-time imports are no run's)
    sides: dict[str, list[dict]] = {"warm": [], "fresh": []}
    for i in range(a.pairs):
        for side in (("warm", "fresh") if i % 2 == 0 else ("fresh", "warm")):
            sides[side].append(one_run(job, fresh_agent=side == "fresh"))
        print(f"pair {i + 1}/{a.pairs}: warm {sides['warm'][-1]['step_time'] * 1e3:.2f} ms, "
              f"fresh {sides['fresh'][-1]['step_time'] * 1e3:.2f} ms", flush=True)

    warm = [r["step_time"] for r in sides["warm"]]
    fresh = [r["step_time"] for r in sides["fresh"]]
    est = paired(warm, fresh, Design(max_pairs=max(12, a.pairs)))
    spread_w, spread_f = relative_spread(warm), relative_spread(fresh)
    lo, hi = spread_ratio_interval(warm, fresh)
    print(f"\nA/A warm agent vs fresh agent: {job.describe()}, {a.pairs} interleaved pairs (ABBA), "
          f"{len(os.sched_getaffinity(0))} cores")
    print(f"  step time warm/fresh: {est.ratio:.4f} [{est.lo:.4f}, {est.hi:.4f}] ({est.level:.0%} paired interval, "
          f"the gate's; holds 1: {est.lo <= 1 <= est.hi})")
    print(f"  run-to-run spread (sd of log run step times): warm {spread_w:.2%}, fresh {spread_f:.2%}; "
          f"warm/fresh {spread_w / spread_f:.2f} [{lo:.2f}, {hi:.2f}] (95% bootstrap over pairs)")
    for side, runs in sides.items():
        walls = [r["wall"] for r in runs]
        startups = [r["startup"] for r in runs if r["startup"] is not None]
        print(f"  {side:5s}: wall {statistics.median(walls):.2f} s a run (median), start-up "
              f"{statistics.median(startups):.2f} s (launch to build)")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "args": vars(a), "cores": len(os.sched_getaffinity(0)), "job": job.describe(), "runs": sides,
            "ratio": est.ratio, "interval": [est.lo, est.hi], "level": est.level, "spread": {"warm": spread_w,
            "fresh": spread_f, "ratio": spread_w / spread_f, "ratio_interval_95_bootstrap": [lo, hi]},
        }, indent=1))


if __name__ == "__main__":
    main()
