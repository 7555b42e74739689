"""Detection power of the baseline gate: false-alarm rate (A/A) and catch rate for injected slowdowns.

Real runs, the real decision: every run is a real job started through the launcher (ranks, warm-up,
timed steps), and every verdict comes from `regression.decide_job` + `regression.confirm`, the code
the plugin runs. Slowdowns are real extra matmul work inside the step (`Shape.extra_work`), never a
sleep; the knob is calibrated first so that 5/10/15 % mean measured step-time increases.

Procedure (pool-resampling, so the figures come in bounded time):
  1. calibrate: runs at extra_work=0 and at a probe value, interleaved -> slowdown per unit of knob;
  2. baseline pool: --pool runs of the unchanged job (the "saved last week" block);
  3. candidate pools, interleaved round-robin: A (unchanged) and one per slowdown size, --pool runs each;
  4. --trials per condition: baseline = --repeats runs drawn from the baseline pool, candidate = --repeats
     runs drawn from the condition's pool; a breach is re-decided on --repeats further runs of that pool
     (the automatic confirmation re-run). Rates are fractions of trials; the 95 % Wilson interval is
     over trials, so it understates the uncertainty that comes from the finite pools (see --pool).

    python benchmarks/detection_power.py                        # 2-core CPU box: ddp, tiny, small pools
    python benchmarks/detection_power.py --device cuda --strategy fsdp2 --shape 1b --pool 10
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import time
from typing import Any

from pytest_distperf.launch import allocator
from pytest_distperf.gate.store import KNOWN_METRICS, JobEntry, MetricSeries
from pytest_distperf.launch.launcher import launch
from pytest_distperf.gate.regression import Policy, confirm, decide_job, is_breach
from pytest_distperf.spec import JobSpec
from pytest_distperf.results import RunResult
from pytest_distperf.measure.stats import relative_spread


def make_job(args: argparse.Namespace, extra_work: float) -> JobSpec:
    return JobSpec(world_size=args.world_size, device=args.device, strategy=args.strategy, shape=args.shape,
                   shape_overrides={"extra_work": extra_work} if extra_work else {}, steps=args.steps,
                   warmup_steps=args.warmup, sys_path=list(sys.path))


def run_once(job: JobSpec, timeout: float) -> RunResult:
    """One real run, holding the machine's devices like the plugin does (allocator.py)."""
    owner = f"detection_power [{job.describe()} extra_work={job.shape_overrides.get('extra_work', 0)}]"
    if job.device == "cuda":
        from pytest_distperf.launch.devices import visible_gpu_ids

        devices = allocator.gpus(job.world_size, visible_gpu_ids(), owner)
    else:
        devices = allocator.cpu(owner)
    start = time.monotonic()
    with devices as env:
        values = launch(job, timeout=timeout, env=env)
    return RunResult(spec=job, ranks=[values[r] for r in sorted(values)], wall_seconds=time.monotonic() - start)


def run_median(steps: list[float]) -> float:
    """A run's value for the gate: the median of its (slowest-rank) step times (as baseline.metrics_from_runs)."""
    return statistics.median(steps)


def calibrate(args: argparse.Namespace) -> float:
    """Measured relative slowdown per unit of extra_work (interleaved runs at 0 and at --calibrate-at)."""
    base, probe = [], []
    for i in range(args.calibrate_runs):
        base.append(run_median(run_once(make_job(args, 0.0), args.timeout).step_times))
        probe.append(run_median(run_once(make_job(args, args.calibrate_at), args.timeout).step_times))
        log(f"calibration {i + 1}/{args.calibrate_runs}: {base[-1] * 1e3:.1f} ms vs {probe[-1] * 1e3:.1f} ms")
    slope = (statistics.median(probe) / statistics.median(base) - 1) / args.calibrate_at
    if slope <= 0:
        raise SystemExit(f"calibration found no slowdown from extra_work={args.calibrate_at} (slope {slope:.3f}); "
                         f"the machine is too noisy or the knob too small: raise --calibrate-at/--calibrate-runs")
    return slope


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return (max(0.0, mid - half), min(1.0, mid + half))


def step_series(runs: list[list[float]]) -> MetricSeries:
    unit, direction, kind = KNOWN_METRICS["step_time"]
    return MetricSeries(unit, direction, kind, [run_median(r) for r in runs], runs)


def trial(baseline_runs: list[list[float]], candidate: list[list[float]], confirm_runs: list[list[float]],
          policy: Policy) -> tuple[str, bool, float]:
    """(final status, first-stage breach, threshold T) of the step-time verdict, exactly as the gate decides it."""
    only = Policy(time_threshold=policy.time_threshold, time_k=policy.time_k, metrics=("step_time",))
    entry = JobEntry(label="job", config_hash="h", config={}, metrics={"step_time": step_series(baseline_runs)})
    first = decide_job("bench", "job", entry, "h", {"step_time": step_series(candidate)}, only, "")
    breach = any(is_breach(v, only) for v in first)
    threshold = first[0].threshold or 0.0
    if breach:
        again = decide_job("bench", "job", entry, "h", {"step_time": step_series(confirm_runs)}, only, "")
        first = confirm(first, again, only)
    return first[0].status, breach, threshold


def checkpoint(args: argparse.Namespace, data: dict[str, Any]) -> None:
    """Write the runs collected so far to --json, so a run cut short (a time limit) keeps them for --from-json."""
    if args.json:
        from pytest_distperf.jsonio import write_json_atomic

        write_json_atomic(args.json, {"args": vars(args), "partial": True, "data": data}, lock=False)


def measure(args: argparse.Namespace, sizes: list[float]) -> dict[str, Any]:
    """Calibrate, then collect the baseline pool and the interleaved candidate pools (step times per run)."""
    if args.knobs:
        knobs = [float(k) for k in args.knobs.split(",")]
        if len(knobs) != len(sizes):
            raise SystemExit("--knobs needs one value per --sizes entry")
        slope = None
    else:
        slope = calibrate(args)
        knobs = [s / slope for s in sizes]
        log(f"calibration: {slope:.3f} relative slowdown per unit of extra_work")
    conditions = [{"name": "A/A", "size": 0.0, "extra_work": 0.0}] + [
        {"name": f"+{s:.0%}", "size": s, "extra_work": k} for s, k in zip(sizes, knobs)]
    baseline_pool: list[list[float]] = []
    pools: dict[str, list[list[float]]] = {c["name"]: [] for c in conditions}
    data = {"job": job_fields(args), "slope": slope, "conditions": conditions, "baseline_pool": baseline_pool,
            "pools": pools}
    return collect(args, data)


JOB_FIELDS = ("device", "world_size", "strategy", "shape", "steps", "warmup")


def job_fields(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in JOB_FIELDS}


def collect(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """Fill the baseline pool, then the candidate pools round-robin, up to --pool runs each; checkpoint after each."""
    baseline_pool, pools = data["baseline_pool"], data["pools"]
    conditions = data["conditions"]
    for i in range(len(baseline_pool), args.pool):
        baseline_pool.append(run_once(make_job(args, 0.0), args.timeout).step_times)
        log(f"baseline pool {i + 1}/{args.pool}: {run_median(baseline_pool[-1]) * 1e3:.2f} ms")
        checkpoint(args, data)
    for i in range(min(len(p) for p in pools.values()), args.pool):
        for c in conditions:  # interleaved, so drift during collection hits every condition alike
            if len(pools[c["name"]]) > i:
                continue  # a resumed round that was cut short part-way
            pools[c["name"]].append(run_once(make_job(args, c["extra_work"]), args.timeout).step_times)
            checkpoint(args, data)
        log(f"candidate pools {i + 1}/{args.pool}: " + ", ".join(
            f"{n} {run_median(p[-1]) * 1e3:.2f} ms" for n, p in pools.items()))
    return data


def analyse(data: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(args.seed)
    policy = Policy(time_threshold=args.time_threshold, time_k=args.time_k)
    baseline_pool, pools = data["baseline_pool"], data["pools"]
    a_center = statistics.median(run_median(r) for r in pools["A/A"])
    rows = []
    for c in data["conditions"]:
        pool = pools[c["name"]]
        counts = {"fail": 0, "warn": 0, "breach": 0}
        thresholds = []
        for _ in range(args.trials):
            base = rng.sample(baseline_pool, args.repeats)
            drawn = rng.sample(pool, 2 * args.repeats)
            status, breach, threshold = trial(base, drawn[: args.repeats], drawn[args.repeats:], policy)
            counts["fail"] += status == "fail"
            counts["warn"] += status == "warn"
            counts["breach"] += breach
            thresholds.append(threshold)
        rows.append({
            **c, "trials": args.trials, **counts,
            # the injected slowdown as measured against the unchanged runs interleaved with it (same block)
            "achieved": statistics.median(run_median(r) for r in pool) / a_center - 1,
            "pool_cv": relative_spread([run_median(r) for r in pool]),
            "median_T": statistics.median(thresholds),
            "fail_rate": counts["fail"] / args.trials, "fail_ci": wilson(counts["fail"], args.trials),
            "flag_rate": (counts["fail"] + counts["warn"]) / args.trials})
    return rows


def show(data: dict[str, Any], rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    job, baseline_pool, pools = data["job"], data["baseline_pool"], data["pools"]
    base_center = statistics.median(run_median(r) for r in baseline_pool)
    a_center = statistics.median(run_median(r) for r in pools["A/A"])
    print(f"\ndetection power: {job['strategy']} {job['shape']} x{job['world_size']} {job['device']}, {job['steps']} "
          f"timed steps/run, {args.repeats} runs per side, pools of {len(baseline_pool)} runs, {args.trials} "
          f"resampled trials per condition")
    print(f"policy: T = max({args.time_threshold:.0%}, {args.time_k:g} x baseline run-to-run variation), "
          f"significance over run-level repeats, a breach confirmed by one re-run")
    print(f"baseline pool: median {base_center * 1e3:.2f} ms, run-to-run variation "
          f"{relative_spread([run_median(r) for r in baseline_pool]):.1%}"
          + (f"; calibration {data['slope']:.3f} slowdown per unit extra_work" if data.get("slope") else ""))
    print(f"drift between the baseline block and the candidate block (unchanged job): {a_center / base_center - 1:+.1%}")
    print(f"{'condition':<10}{'extra_work':>11}{'achieved':>10}{'pool cv':>9}{'median T':>10}{'failed (gate)':>15}"
          f"{'95% CI':>17}{'fail|warn':>11}{'1st-stage':>11}")
    for r in rows:
        lo, hi = r["fail_ci"]
        print(f"{r['name']:<10}{r['extra_work']:>11.3f}{r['achieved']:>+10.1%}{r['pool_cv']:>9.1%}"
              f"{r['median_T']:>10.1%}{r['fail_rate']:>15.1%}{f'[{lo:.1%}, {hi:.1%}]':>17}{r['flag_rate']:>11.1%}"
              f"{r['breach'] / r['trials']:>11.1%}")
    print("A/A 'failed' is the false-alarm rate; for the slowdowns it is the catch rate. 'achieved': the slowdown "
          "measured against the unchanged runs of the same block; median T: the gate's threshold; fail|warn also "
          "counts warnings; 1st-stage: breaches before the confirmation re-run.")


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--strategy", default="ddp")
    ap.add_argument("--shape", default=None, help="workload shape (default: tiny on CPU, 1b on CUDA)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="runs per side of one comparison (the gate's repeats)")
    ap.add_argument("--pool", type=int, default=6, help="runs per condition pool (>= 2 x repeats)")
    ap.add_argument("--trials", type=int, default=500, help="resampled comparisons per condition")
    ap.add_argument("--sizes", default="0.05,0.10,0.15", help="injected slowdowns (relative)")
    ap.add_argument("--knobs", default=None, help="extra_work values per size (skips calibration)")
    ap.add_argument("--calibrate-at", type=float, default=0.5, help="extra_work value the calibration measures")
    ap.add_argument("--calibrate-runs", type=int, default=4)
    ap.add_argument("--time-threshold", type=float, default=Policy.time_threshold)
    ap.add_argument("--time-k", type=float, default=Policy.time_k)
    ap.add_argument("--timeout", type=float, default=900.0, help="wall-clock limit per run (s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the figures and every run's step times here")
    ap.add_argument("--from-json", default=None, help="re-analyse the runs a --json file holds (no new runs), e.g. "
                                                      "with another --time-k")
    ap.add_argument("--resume", default=None, help="continue collecting the pools of a --json file that a time "
                                                   "limit cut short (same job and knobs; no new calibration)")
    args = ap.parse_args(argv)
    args.shape = args.shape or ("1b" if args.device == "cuda" else "tiny")
    if args.pool < 2 * args.repeats:
        ap.error(f"--pool {args.pool} must be at least 2 x --repeats ({2 * args.repeats}): a candidate and its "
                 f"confirmation re-run are drawn without overlap")
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    started = time.monotonic()
    if args.from_json:
        with open(args.from_json) as f:
            data = json.load(f)["data"]
        smallest = min(len(p) for p in [data["baseline_pool"], *data["pools"].values()])
        if smallest < 2 * args.repeats:
            raise SystemExit(f"{args.from_json}: its smallest pool holds {smallest} runs, fewer than 2 x --repeats "
                             f"({2 * args.repeats}); re-analyse with a smaller --repeats")
    elif args.resume:
        with open(args.resume) as f:
            resumed = json.load(f)["data"]
        if resumed["job"] != job_fields(args):
            raise SystemExit(f"{args.resume}: recorded for job {resumed['job']}, not {job_fields(args)}; "
                             f"pass the same --device/--strategy/--shape/--steps/--warmup/--world-size")
        log(f"resuming: baseline pool {len(resumed['baseline_pool'])}/{args.pool}, candidate pools "
            f"{min(len(p) for p in resumed['pools'].values())}/{args.pool} (its calibration and knobs kept)")
        data = collect(args, resumed)
    else:
        data = measure(args, sizes)
    rows = analyse(data, args)
    show(data, rows, args)
    print(f"wall time {time.monotonic() - started:.0f} s")
    if args.json:
        from pytest_distperf.jsonio import write_json_atomic

        write_json_atomic(args.json, {"args": vars(args), "rows": rows, "data": data}, lock=False)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
