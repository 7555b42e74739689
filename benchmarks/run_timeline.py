"""Where one run's wall time goes, end to end, including what the run split's "other" holds.

figures/quantities.run_time_split names start-up, build, warm-up, timed steps and the phases after timing from
the ranks' own clocks; "other" is the rest: the rank's end (its result, the process group's teardown, the
interpreter's and the device context's), the elastic agent noticing the exits and writing its result, and the
launcher reading it. This launches a job's runs one after another, keeps each job folder and reads its files'
times (rank{r}.pid: the rank began its body, after the job agent's fork, the rendezvous and the rank's fork; from
there to the build: the device context, the process group, the job's imports; rank{r}.returned: the body ended; exit-rank{r}.txt: its agent saw the process end; result.pkl: the
agent's result) against the launcher's clock. Median over the runs after the first (which starts the warm agent).

    python benchmarks/run_timeline.py --device cpu --strategy ddp --shape tiny --world-size 2 --runs 5
    python benchmarks/run_timeline.py --device cuda --strategy fsdp2 --shape 1b --world-size 1 --runs 4
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PARTS = ("rank's launch", "rank's start", "build", "warm-up", "timed", "after timing", "rank's end", "process exit", "agent's end",
         "launcher's end")


def timeline(run_started: float, run_ended: float, job_dir: str, ranks: dict[int, object]) -> dict[str, float]:
    from pytest_distperf.launch import jobfiles

    r = max(ranks.values(), key=lambda v: v.build_started_at)  # type: ignore[attr-defined]
    built = r.build_started_at + r.build_seconds  # type: ignore[attr-defined]
    timed = math.fsum(r.step_times)  # type: ignore[attr-defined]
    after_end = built + r.warmup_seconds + timed + r.after_seconds  # type: ignore[attr-defined]
    rank_started = max(os.path.getmtime(os.path.join(job_dir, f"rank{k}.pid")) for k in ranks)
    returned = max(os.path.getmtime(os.path.join(job_dir, f"rank{k}.returned")) for k in ranks)
    exited = max(jobfiles.exit_time(job_dir, k) for k in ranks)
    result = os.path.getmtime(os.path.join(job_dir, "result.pkl"))
    points = [run_started, rank_started, r.build_started_at, built, built + r.warmup_seconds,  # type: ignore[attr-defined]
              built + r.warmup_seconds + timed, after_end, returned, exited, result, run_ended]  # type: ignore
    return {name: b - a for name, a, b in zip(PARTS, points, points[1:])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--strategy", default="ddp")
    p.add_argument("--options", default="{}", help="strategy options, JSON")
    p.add_argument("--shape", default="tiny")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", help="write every run's timeline here")
    args = p.parse_args(argv)

    from pytest_distperf import strategies
    from pytest_distperf.launch.launcher import launch
    from pytest_distperf.spec.job import JobSpec

    options = json.loads(args.options)
    base = tempfile.mkdtemp(prefix="distperf-timeline-")
    runs = []
    for i in range(args.runs):
        job = JobSpec(world_size=args.world_size, device=args.device, strategy=args.strategy, options=options,
                      shape=args.shape, steps=args.steps, warmup_steps=args.warmup,
                      full_options=strategies.validate(args.strategy, options))
        before = set(glob.glob(os.path.join(base, "*")))
        started = time.time()
        ranks = launch(job, timeout=600, base_dir=base, keep=True)
        ended = time.time()
        (job_dir,) = {d for d in set(glob.glob(os.path.join(base, "*"))) - before
                      if os.path.exists(os.path.join(d, "result.pkl"))}
        t = timeline(started, ended, job_dir, ranks)
        runs.append({"wall": ended - started, **t})
        print(f"run {i + 1}: wall {ended - started:.2f} s: " + ", ".join(f"{k} {v:.3f}" for k, v in t.items()),
              flush=True)
    later = runs[1:] or runs
    print(f"\n{job.describe()}, median of runs 2-{len(runs)}:")
    for key in ("wall", *PARTS):
        value = statistics.median(r[key] for r in later)
        print(f"  {key:15s} {value:7.3f} s  {value / statistics.median(r['wall'] for r in later):6.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps({"job": job.describe(), "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
