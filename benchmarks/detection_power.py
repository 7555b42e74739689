"""Detection power of the shipped decision: false alarms, catch rate and pairs used, on real runs.

Real runs: every run is a real job started through the launcher (ranks, warm-up, timed steps). Slowdowns
are real extra matmul work inside the step (`Shape.extra_work`), never a sleep; the knob is calibrated first
so that each size means that measured step-time increase.

Collection (checkpointed to --json after every run; --resume continues a collection a time limit cut short):
  1. calibrate: interleaved runs at extra_work 0 and at --calibrate-at -> slowdown per unit of the knob;
  2. stored block: --stored runs of the unchanged job (the baseline "saved last week");
  3. --rounds rounds, each one run of every condition: `ref` and `A/A` (both the unchanged job) and one per
     slowdown size, in an order that rotates every round, so drift hits every condition alike.

Analysis (re-sampling the recorded runs; --from-json re-analyses a file, also the older pool layout):
  paired  the ratio checks between two jobs. A sequence draws rounds at random; a drawn round gives the
          interleaved pair (condition run, ref run). --repeats pairs to start, then the
          plugin's own Comparison.assert_step_time_within(1 + floor) adds pairs while INCONCLUSIVE, up to
          --max-pairs (decide/checks.py with its Adaptive: the shipped code, not a copy).
  gate    the baseline gate. The stored baseline is two thirds of the stored block (a different subset each
          trial); the candidate starts with --repeats runs drawn from the condition's runs and
          regression.until_job_decided adds one at a time while the step-time verdict is INCONCLUSIVE, exactly as
          BaselineGate.check does.
  Draws are without replacement while a pool lasts (then with replacement: a pool smaller than the budget
  repeats runs, which understates the spread).
  FAIL is an alarm: for A/A a false alarm, for a slowdown a catch. Each rate has a 95 % Wilson interval over
  the --trials decisions, the pairs used a 95 % interval of their mean. The intervals are over trials: they
  leave out the uncertainty of the finite pools the trials re-sample (a pool's own mean ratio, printed as
  'pool', is the re-sampled world's true effect; for A/A it is not exactly 1).

    python benchmarks/detection_power.py --strategy ddp --json dp-ddp.json              # 2-core CPU box
    python benchmarks/detection_power.py --from-json benchmarks/results/detection-power-cpu-ddp-tiny.json
    python benchmarks/detection_power.py --device cuda --world-size 1 --strategy fsdp2 --shape 1b --steps 20 \\
        --stored 8 --rounds 8 --sizes 0.03,0.05 --json dp-1xh200.json
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_distperf.errors import DistPerfCheckFailed  # noqa: E402
from pytest_distperf.decide import regression  # noqa: E402
from pytest_distperf.decide.policy import Policy  # noqa: E402
from pytest_distperf.decide.checks import Adaptive, Comparison  # noqa: E402
from pytest_distperf.store.baselines import MetricSeries  # noqa: E402
from pytest_distperf.figures.quantities import KNOWN_METRICS, JobRuns  # noqa: E402
from pytest_distperf.launch import allocator  # noqa: E402
from pytest_distperf.launch.launcher import launch  # noqa: E402
from pytest_distperf.decide.decision import Design  # noqa: E402
from pytest_distperf.decide.stopping import Budget, Clock  # noqa: E402
from pytest_distperf.decide.verdicts import MetricVerdict, decide_metric  # noqa: E402
from pytest_distperf.figures.stats import quantile, relative_spread  # noqa: E402
from benchmarks.rates import wilson  # noqa: E402
from pytest_distperf.rank.results import RankResult, RunResult  # noqa: E402
from pytest_distperf.spec.job import JobSpec  # noqa: E402

JOB_FIELDS = ("device", "world_size", "strategy", "shape", "steps", "warmup")


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


def run_value(steps: list[float]) -> float:
    """A run's step time as every report and verdict has it (figures/quantities.run_step_time: the median of the
    run's steps, each the slowest rank's -- the recorded step times already are)."""
    return quantile(steps, 0.5)


def calibrate(args: argparse.Namespace) -> float:
    """Measured relative slowdown per unit of extra_work (interleaved runs at 0 and at --calibrate-at)."""
    base, probe = [], []
    for i in range(args.calibrate_runs):
        base.append(run_value(run_once(make_job(args, 0.0), args.timeout).step_times))
        probe.append(run_value(run_once(make_job(args, args.calibrate_at), args.timeout).step_times))
        log(f"calibration {i + 1}/{args.calibrate_runs}: {base[-1] * 1e3:.1f} ms vs {probe[-1] * 1e3:.1f} ms")
    slope = (statistics.median(probe) / statistics.median(base) - 1) / args.calibrate_at
    if slope <= 0:
        raise SystemExit(f"calibration found no slowdown from extra_work={args.calibrate_at} (slope {slope:.3f}); "
                         f"the machine is too noisy or the knob too small: raise --calibrate-at/--calibrate-runs")
    return slope


# -- collection ---------------------------------------------------------------------------------------------------
def job_fields(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k) for k in JOB_FIELDS}


def checkpoint(args: argparse.Namespace, data: dict[str, Any]) -> None:
    """Write the runs collected so far to --json, so a run cut short (a time limit) keeps them."""
    if args.json:
        from pytest_distperf.fs.jsonio import write_json_atomic

        write_json_atomic(args.json, {"args": vars(args), "partial": True, "data": data}, lock=False)


def measure(args: argparse.Namespace, sizes: list[float]) -> dict[str, Any]:
    """Calibrate, then collect the stored block and the interleaved rounds."""
    if args.knobs:
        knobs = [float(k) for k in args.knobs.split(",")]
        if len(knobs) != len(sizes):
            raise SystemExit("--knobs needs one value per --sizes entry")
        slope = None
    else:
        slope = calibrate(args)
        knobs = [s / slope for s in sizes]
        log(f"calibration: {slope:.3f} relative slowdown per unit of extra_work")
    conditions = [{"name": "ref", "size": 0.0, "extra_work": 0.0}, {"name": "A/A", "size": 0.0, "extra_work": 0.0}]
    conditions += [{"name": f"+{s:.0%}", "size": s, "extra_work": k} for s, k in zip(sizes, knobs)]
    data = {"job": job_fields(args), "slope": slope, "conditions": conditions, "stored": [], "rounds": []}
    return collect(args, data)


def _record(run: RunResult) -> dict[str, Any]:
    load = run.host_other_load
    return {"steps": list(run.step_times), "host_other_load_cores": round(load[0], 2) if load else None}


def collect(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    """Fill the stored block, then the rounds (each condition once, rotating order); checkpoint after each run."""
    stored, rounds, conditions = data["stored"], data["rounds"], data["conditions"]
    for i in range(len(stored), args.stored):
        stored.append(_record(run_once(make_job(args, 0.0), args.timeout)))
        log(f"stored {i + 1}/{args.stored}: {run_value(stored[-1]['steps']) * 1e3:.2f} ms")
        checkpoint(args, data)
    for r in range(args.rounds):
        if r == len(rounds):
            rounds.append({})
        shift = r % len(conditions)
        for c in conditions[shift:] + conditions[:shift]:  # A B, then B A ...: the order rotates every round
            if c["name"] in rounds[r]:
                continue  # a resumed round that was cut short part-way
            rounds[r][c["name"]] = _record(run_once(make_job(args, c["extra_work"]), args.timeout))
            checkpoint(args, data)
        log(f"round {r + 1}/{args.rounds}: " + ", ".join(
            f"{c['name']} {run_value(rounds[r][c['name']]['steps']) * 1e3:.2f} ms" for c in conditions))
    return data


def from_pools(data: dict[str, Any]) -> dict[str, Any]:
    """The earlier layout (a baseline block and per-condition pools filled round-robin, no second unchanged run
    per round) as stored block + rounds: its A/A pool is the rounds' `ref`; there is no paired A/A."""
    if "rounds" in data:
        return data
    pools = data["pools"]
    n = min(len(p) for p in pools.values())
    rounds = [{("ref" if name == "A/A" else name): {"steps": pools[name][i], "host_other_load_cores": None}
               for name in pools} for i in range(n)]
    conditions = [{**c, "name": "ref"} if c["name"] == "A/A" else c for c in data["conditions"]]
    return {**data, "conditions": conditions, "stored": [{"steps": s, "host_other_load_cores": None}
                                                         for s in data["baseline_pool"]], "rounds": rounds}


# -- analysis: the shipped decision over re-sampled recorded runs -------------------------------------------------
def recorded_run(steps: list[float], device: str) -> RunResult:
    """A recorded run as the plugin's checks read it: its (slowest-rank) step times."""
    rank = RankResult(rank=0, step_times=list(steps), losses=[0.0] * len(steps), cuda_peak_allocated=None,
                      cuda_peak_reserved=None, host_peak_rss=0, host_rss_before_build=0, optimizer_state_bytes=0,
                      num_params=1, tokens_per_step=1, build_seconds=0.0, warmup_seconds=0.0)
    return RunResult(spec=JobSpec(world_size=1, device=device, strategy="recorded"), ranks=[rank], wall_seconds=0.0)


class Draws:
    """Indices into a pool of n recorded runs: without replacement while the pool lasts, then with replacement
    (a duplicated run would understate the spread, so duplicates come only from pools smaller than needed)."""

    def __init__(self, rng: random.Random, n: int):
        self.rng, self.n, self.left = rng, n, rng.sample(range(n), n)

    def next(self) -> int:
        return self.left.pop() if self.left else self.rng.randrange(self.n)


def paired_trial(rng: random.Random, cond: list[RunResult], ref: list[RunResult], limit: float,
                 args: argparse.Namespace) -> tuple[str, int]:
    """One comparison as the harness runs it: (outcome, pairs used)."""
    a_runs: list[RunResult] = []
    b_runs: list[RunResult] = []
    a, b = JobRuns("condition", [a_runs]), JobRuns("ref", [b_runs])
    draws = Draws(rng, len(cond))

    def one_more_pair() -> None:
        i = draws.next()
        # copies: JobRuns counts a run object once, and a pair drawn again is another pair
        a_runs.append(copy.copy(cond[i]))
        b_runs.append(copy.copy(ref[i]))

    for _ in range(args.repeats):
        one_more_pair()
    outcome = []
    adaptive = Adaptive(extend=one_more_pair, budget=Budget(max_pairs=args.max_pairs, first_look=args.repeats),
                        clock=Clock(),
                        on_inconclusive=lambda check, message: outcome.append("inconclusive"))
    try:
        check = Comparison(a, b, adaptive=adaptive).assert_step_time_within(limit)
        return check.outcome, check.pairs
    except DistPerfCheckFailed as e:
        return "fail", e.check.pairs


def gate_trial(rng: random.Random, cond: list[float], stored: list[float], floor: float,
               args: argparse.Namespace) -> tuple[str, int]:
    """One baseline verdict as BaselineGate.check reaches it: (status, candidate runs used)."""
    unit, direction, kind = KNOWN_METRICS["step_time"]
    # the stored baseline: two thirds of the stored block, a different subset each trial
    base = MetricSeries(unit, direction, kind, rng.sample(stored, max(2, len(stored) * 2 // 3)))
    draws = Draws(rng, len(cond))
    cand = [cond[draws.next()] for _ in range(args.repeats)]
    policy, design = Policy(time_threshold=floor), Design(max_pairs=args.max_pairs, first_look=args.repeats)

    def verdicts() -> list[MetricVerdict]:
        return [decide_metric("bench", "job", "step_time", base, MetricSeries(unit, direction, kind, cand),
                              policy, design)]

    regression.until_job_decided(verdicts, lambda: len(cand), lambda: cand.append(cond[draws.next()]),
                             Budget(max_pairs=args.max_pairs, first_look=args.repeats), Clock())  # the design's looks
    return verdicts()[0].status, len(cand)


def summarise(outcomes: list[tuple[str, int]]) -> dict[str, Any]:
    n = len(outcomes)
    fails = sum(o == "fail" for o, _ in outcomes)
    pairs = [p for _, p in outcomes]
    mean = statistics.fmean(pairs)
    half = 1.96 * statistics.stdev(pairs) / math.sqrt(n) if n > 1 else 0.0
    return {"trials": n, "fail": fails, "fail_rate": fails / n, "fail_ci": wilson(fails, n),
            "pass_rate": sum(o == "pass" for o, _ in outcomes) / n,
            "inconclusive_rate": sum(o == "inconclusive" for o, _ in outcomes) / n,
            "pairs_mean": mean, "pairs_ci": (mean - half, mean + half), "pairs_median": quantile(pairs, 0.5),
            "pairs_max": max(pairs)}


def analyse(data: dict[str, Any], args: argparse.Namespace) -> list[dict[str, Any]]:
    data = from_pools(data)
    rng = random.Random(args.seed)
    device = data["job"]["device"]
    names = [c["name"] for c in data["conditions"]]
    rounds = [r for r in data["rounds"] if all(n in r for n in names)]  # a cut-short last round is left out
    values = {n: [run_value(r[n]["steps"]) for r in rounds] for n in names}
    runs = {n: [recorded_run(r[n]["steps"], device) for r in rounds] for n in names}
    stored = [run_value(s["steps"]) for s in data["stored"]]
    rows = []
    for floor in args.floors:
        for c in data["conditions"]:
            name = c["name"]
            if name == "ref":
                continue
            pool = statistics.fmean(math.log(x / y) for x, y in zip(values[name], values["ref"]))
            paired = [paired_trial(rng, runs[name], runs["ref"], 1.0 + floor, args) for _ in range(args.trials)]
            rows.append({"mode": "paired", "condition": name, "size": c["size"], "floor": floor,
                         "pool": math.exp(pool) - 1, **summarise(paired)})
        for c in data["conditions"]:
            name = "ref" if c["name"] == "A/A" and "ref" in values else c["name"]
            if c["name"] == "ref" and "A/A" in values:
                continue  # the gate's A/A is the ref pool against the stored block (ref and A/A are alike)
            pool = statistics.fmean(math.log(x) for x in values[name]) - statistics.fmean(math.log(x) for x in stored)
            gate = [gate_trial(rng, values[name], stored, floor, args) for _ in range(args.trials)]
            rows.append({"mode": "gate", "condition": "A/A" if c["size"] == 0 else c["name"], "size": c["size"],
                         "floor": floor, "pool": math.exp(pool) - 1, **summarise(gate)})
    return rows


def show(data: dict[str, Any], rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    data = from_pools(data)
    job = data["job"]
    names = [c["name"] for c in data["conditions"]]
    rounds = [r for r in data["rounds"] if all(n in r for n in names)]
    ref = [run_value(r["ref"]["steps"]) for r in rounds]
    stored = [run_value(s["steps"]) for s in data["stored"]]
    print(f"\ndetection power: {job['strategy']} {job['shape']} x{job['world_size']} {job['device']}, {job['steps']} "
          f"timed steps a run; {len(stored)} stored runs, {len(rounds)} rounds of {', '.join(names)}; "
          f"{args.trials} re-sampled decisions per row; {args.repeats} pairs (runs) to start, at most {args.max_pairs}")
    print(f"run-to-run: stored {relative_spread(stored):.1%}, ref {relative_spread(ref):.1%}; stored block vs ref "
          f"{statistics.median(ref) / statistics.median(stored) - 1:+.1%} (drift between the blocks)"
          + (f"; calibration {data['slope']:.3f} slowdown per unit extra_work" if data.get("slope") else ""))
    if "A/A" in names:
        pair_logs = [math.log(run_value(r["A/A"]["steps"]) / run_value(r["ref"]["steps"])) for r in rounds]
        rho = _correlation([math.log(run_value(r["A/A"]["steps"])) for r in rounds], [math.log(x) for x in ref])
        print(f"pair-to-pair (A/A vs ref): sd of log ratio {statistics.stdev(pair_logs):.1%}, correlation of a "
              f"round's two unchanged runs {rho:+.2f}")
    loads = [x["host_other_load_cores"] for r in rounds for x in r.values() if x.get("host_other_load_cores") is not None]
    if loads:
        print(f"other work on the host while timing (cores): median {statistics.median(loads):.2f}, max {max(loads):.2f}")
    print(f"{'mode':<7}{'condition':<10}{'pool':>8}{'limit':>7}{'FAIL':>8}{'95% CI':>17}{'PASS':>7}{'inconcl.':>9}"
          f"{'pairs mean [95% CI]':>22}{'median':>8}{'max':>5}")
    for r in rows:
        lo, hi = r["fail_ci"]
        plo, phi = r["pairs_ci"]
        pairs = f"{r['pairs_mean']:.1f} [{plo:.1f}, {phi:.1f}]"
        print(f"{r['mode']:<7}{r['condition']:<10}{r['pool']:>+8.1%}{1 + r['floor']:>7.2f}{r['fail_rate']:>8.1%}"
              f"{f'[{lo:.1%}, {hi:.1%}]':>17}{r['pass_rate']:>7.1%}{r['inconclusive_rate']:>9.1%}{pairs:>22}"
              f"{r['pairs_median']:>8.0f}{r['pairs_max']:>5}")
    print("FAIL for A/A is the false-alarm rate, for a slowdown the catch rate; 'pool': the condition's mean ratio in "
          "the recorded runs (paired: to the same round's ref; gate: to the stored block); pairs: interleaved pairs "
          "(paired) or candidate runs (gate) used by the decision.")


def _correlation(x: list[float], y: list[float]) -> float:
    try:
        return statistics.correlation(x, y)
    except statistics.StatisticsError:
        return float("nan")


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
    ap.add_argument("--stored", type=int, default=12, help="runs of the stored block (the saved baseline)")
    ap.add_argument("--rounds", type=int, default=14, help="rounds of interleaved runs (one per condition)")
    ap.add_argument("--sizes", default="0.15", help="injected slowdowns (relative), list")
    ap.add_argument("--knobs", default=None, help="extra_work values per size (skips calibration)")
    ap.add_argument("--calibrate-at", type=float, default=0.5, help="extra_work value the calibration measures")
    ap.add_argument("--calibrate-runs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="pairs (runs) a decision starts with (the test's repeats)")
    ap.add_argument("--max-pairs", type=int, default=12, help="the adaptive budget (--distperf-max-repeats)")
    ap.add_argument("--floors", default="0,0.05", help="limits as 1 + floor (the gate's time_threshold), list")
    ap.add_argument("--trials", type=int, default=400, help="re-sampled decisions per row (>= 200)")
    ap.add_argument("--timeout", type=float, default=900.0, help="wall-clock limit per run (s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write every run's step times (checkpointed) and the figures here")
    ap.add_argument("--from-json", default=None, help="re-analyse the runs a --json file holds (no new runs)")
    ap.add_argument("--resume", default=None, help="continue collecting into the runs of a --json file that a "
                                                   "time limit cut short (same job and knobs; no new calibration)")
    args = ap.parse_args(argv)
    args.shape = args.shape or ("1b" if args.device == "cuda" else "tiny")
    args.floors = [float(x) for x in str(args.floors).split(",") if x.strip()]
    if not 1 <= args.repeats <= args.max_pairs:
        ap.error("--repeats must be in [1, --max-pairs]")
    sizes = [float(s) for s in args.sizes.split(",") if s.strip()]
    started = time.monotonic()
    if args.from_json:
        with open(args.from_json) as f:
            data = json.load(f)["data"]
    elif args.resume:
        with open(args.resume) as f:
            resumed = json.load(f)["data"]
        if resumed["job"] != job_fields(args):
            raise SystemExit(f"{args.resume}: recorded for job {resumed['job']}, not {job_fields(args)}; "
                             f"pass the same --device/--strategy/--shape/--steps/--warmup/--world-size")
        log(f"resuming: stored {len(resumed['stored'])}/{args.stored}, rounds {len(resumed['rounds'])}/{args.rounds} "
            f"(its calibration and knobs kept)")
        data = collect(args, resumed)
    else:
        data = measure(args, sizes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the checks' DistPerfInconclusive: counted, not printed
        rows = analyse(data, args)
    show(data, rows, args)
    print(f"wall time {time.monotonic() - started:.0f} s")
    if args.json:
        from pytest_distperf.fs.jsonio import write_json_atomic

        write_json_atomic(args.json, {"args": vars(args), "rows": rows, "data": data}, lock=False)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
