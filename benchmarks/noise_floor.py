"""The machine's own noise floor, printed as figures: how much any step-time gate can resolve here.

detection_power.py measures what the gate catches; this says why it cannot catch less. Two figures:

1. Compute throughput of one core: a fixed single-threaded matmul counted over back-to-back windows,
   with nothing else of ours running. Its variation is the host's (shared hypervisor, frequency,
   neighbours), below anything the harness does.
2. Run-to-run variation of a real job: --runs runs started through the launcher like the plugin's,
   each reduced to the gate's run value (median step time of the slowest rank).

A gate with T = max(5 %, k x run-to-run variation) cannot catch slowdowns much below T, so when (1)
is already ~10 % a 15 % catch on this machine is out of reach whatever the job.

    python benchmarks/noise_floor.py                          # 2-core CPU box: ddp tiny, 6 runs
    python benchmarks/noise_floor.py --shape small --runs 4
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.detection_power import make_job, run_once, run_value  # noqa: E402
from pytest_distperf.figures.stats import relative_spread  # noqa: E402


def matmul_windows(windows: int, seconds: float, size: int) -> list[float]:
    """Matmuls per second of one thread, per window."""
    torch.set_num_threads(1)
    a = torch.randn(size, size)
    rates = []
    for _ in range(windows):
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            a @ a
            count += 1
        rates.append(count / (time.perf_counter() - start))
    return rates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--windows", type=int, default=10, help="matmul throughput windows")
    ap.add_argument("--window-seconds", type=float, default=3.0)
    ap.add_argument("--matmul-size", type=int, default=512)
    ap.add_argument("--runs", type=int, default=6, help="job runs for the run-to-run variation (0: skip)")
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--shape", default="tiny")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=900.0)
    args = ap.parse_args(argv)
    if args.runs == 1:
        ap.error("--runs needs 0 (skip) or at least 2 to give a variation")

    rates = matmul_windows(args.windows, args.window_seconds, args.matmul_size)
    print(f"one core, {args.matmul_size}x{args.matmul_size} fp32 matmul, {args.windows} windows of "
          f"{args.window_seconds:g} s: {min(rates):.0f}-{max(rates):.0f}/s, variation {relative_spread(rates):.1%}", flush=True)

    if args.runs:
        job = make_job(args, 0.0)
        values = []
        for i in range(args.runs):
            steps = run_once(job, args.timeout).step_times
            values.append(run_value(steps))
            print(f"run {i + 1}/{args.runs}: {values[-1] * 1e3:.1f} ms, within-run step variation {relative_spread(steps):.1%}",
                  flush=True)
        print(f"{job.describe()}, {args.steps} timed steps a run: run-to-run variation {relative_spread(values):.1%} over "
              f"{args.runs} runs ({min(values) * 1e3:.1f}-{max(values) * 1e3:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
