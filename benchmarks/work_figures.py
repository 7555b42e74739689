"""Detection power of the work figures beside wall time, on real runs of a user workload.

The workload (written below into two folders, one module each, the same name) is a stack of small residual MLP
blocks: many short kernels, so on a GPU the step is host-bound (Python, launches, a strategy's hooks), as
CI-sized jobs are. The change is a code change inside the workload, its kwargs unchanged: the changed copy makes
each sequence 3 % longer (`SEQ`), so the step does 3 % more GPU work and FLOPs. The job's configuration hash
names the module, not its folder, so the gate reads the changed copy as a change of the same job.

Collection: a stored block of --stored runs of the base copy (the baseline), then --rounds rounds, each one run of
`A/A` (the base copy again) and one of `changed` (the changed copy), their order alternating. Analysis, re-sampling
the recorded runs as benchmarks/detection_power.py does: the stored baseline is two thirds of the stored block (a
different subset each trial); the candidate starts with --repeats runs and `regression.until_job_decided` adds one at a
time while the verdict is INCONCLUSIVE, up to --max-runs, exactly as BaselineGate.check does; every metric is
decided by the shipped `verdicts.decide_metric` with the default policy (wall time against its 5 % floor,
gpu_time against the 1 % work floor, counts exactly). FAIL on A/A is a false alarm, on `changed` a catch; a count
starts from one candidate run, a time from --repeats.

    python benchmarks/work_figures.py --device cpu --strategy ddp                   # 2-core CPU box
    python benchmarks/work_figures.py --device cuda --world-size 1 --strategy fsdp2,deepspeed --width 1024 \
        --seq 512 --batch 8 --stored 5 --rounds 5 --json wf.json                     # 1xH200
    python benchmarks/work_figures.py --from-json benchmarks/results/work-figures-1xh200.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.detection_power import run_once  # noqa: E402  (one way to run a job, holding its devices)
from pytest_distperf.decide import regression  # noqa: E402
from pytest_distperf.decide.policy import Policy  # noqa: E402
from pytest_distperf.store.baselines import MetricSeries  # noqa: E402
from pytest_distperf.figures.quantities import metric_traits  # noqa: E402
from pytest_distperf.decide.decision import Design  # noqa: E402
from pytest_distperf.decide.stopping import Budget, Clock  # noqa: E402
from pytest_distperf.decide.verdicts import MetricVerdict, decide_metric  # noqa: E402
from pytest_distperf.figures.quantities import run_gpu_busy, run_step_time, run_work  # noqa: E402
from pytest_distperf.figures.stats import relative_spread  # noqa: E402
from benchmarks.rates import wilson  # noqa: E402
from pytest_distperf.rank.results import RunResult  # noqa: E402
from pytest_distperf.spec.job import FunctionRef, JobSpec  # noqa: E402

MODULE = "distperf_hostbound"
WORKLOAD = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

from pytest_distperf import Workload

SEQ = {seq}  # the code change: a longer sequence is more GPU work per step


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 2 * width)
        self.down = nn.Linear(2 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Net(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.head = nn.Linear(width, 1)

    def forward(self, x):
        x = x.to(self.head.weight.dtype)  # the strategy's precision (DeepSpeed bf16 does not cast inputs)
        return self.head(self.blocks(x)).squeeze(-1).float()


def loss(model, batch):
    x, y = batch
    return F.mse_loss(model(x), y)


def make_workload(width=256, depth=24, batch_size=4):
    def batch(step, rank):
        g = torch.Generator().manual_seed(step * 1009 + rank)
        x = torch.randn(batch_size, SEQ, width, generator=g)
        return x, x.mean(-1)

    return Workload(model=lambda: Net(width, depth), batch=batch, loss=loss, wrap_units=(Block,),
                    micro_batch=batch_size, tokens_per_batch=batch_size * SEQ)
'''
METRICS = ("step_time", "gpu_time", "kernels_per_step", "flops_per_step", "aten_ops_per_step",
           "instructions_per_step")


def write_workloads(root: str, seq: int, change: float) -> dict[str, str]:
    """The base copy and the changed one (a longer sequence), each in a folder of its own, the same module name."""
    folders = {}
    for name, s in (("base", seq), ("changed", round(seq * change))):
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, f"{MODULE}.py"), "w") as f:
            f.write(WORKLOAD.format(seq=s))
        folders[name] = folder
    return folders


def make_job(args: argparse.Namespace, strategy: str, folder: str) -> JobSpec:
    options = {"stage": 3} if strategy == "deepspeed" else {}
    return JobSpec(world_size=args.world_size, device=args.device, strategy=strategy, options=options,
                   workload=FunctionRef(MODULE, "make_workload"), steps=args.steps, warmup_steps=3,
                   workload_kwargs={"width": args.width, "depth": args.depth, "batch_size": args.batch},
                   sys_path=[folder] + list(sys.path))


def record(run: RunResult) -> dict[str, Any]:
    """A run as the analysis reads it: its metric values as the gate computes them, and the timings."""
    busy = run_gpu_busy(run)
    return {"step_time": run_step_time(run), **run_work(run), "gpu_busy": busy, "wall_seconds": run.wall_seconds,
            "build_seconds": max(r.build_seconds for r in run.ranks)}


def collect(args: argparse.Namespace) -> dict[str, Any]:
    data: dict[str, Any] = {"args": vars(args), "strategies": {}}
    with tempfile.TemporaryDirectory() as root:
        folders = write_workloads(root, args.seq, args.change)
        for strategy in args.strategy.split(","):
            base, changed = make_job(args, strategy, folders["base"]), make_job(args, strategy, folders["changed"])
            started = time.monotonic()
            stored = []
            for i in range(args.stored):
                stored.append(record(run_once(base, args.timeout)))
                log(f"{strategy} stored {i + 1}/{args.stored}: {fmt(stored[-1])}")
            rounds = []
            for i in range(args.rounds):
                order = [("A/A", base), ("changed", changed)]
                rnd = {name: record(run_once(job, args.timeout)) for name, job in (order if i % 2 == 0 else order[::-1])}
                rounds.append(rnd)
                log(f"{strategy} round {i + 1}/{args.rounds}: A/A {fmt(rnd['A/A'])} | changed {fmt(rnd['changed'])}")
            data["strategies"][strategy] = {"stored": stored, "rounds": rounds,
                                            "seconds": time.monotonic() - started}
            if args.json:
                Path(args.json).write_text(json.dumps(data, indent=1))
    return data


def fmt(r: dict[str, Any]) -> str:
    parts = [f"step {r['step_time'] * 1e3:.1f} ms"]
    if r.get("gpu_time"):
        parts.append(f"gpu {r['gpu_time'] * 1e3:.3f} ms, busy {r['gpu_busy'] / r['step_time']:.0%}")
    if r.get("flops_per_step"):
        parts.append(f"{r['flops_per_step']:.6g} FLOP")
    if r.get("kernels_per_step"):
        parts.append(f"{r['kernels_per_step']:.0f} kernels")
    return ", ".join(parts)


def gate_trial(rng: random.Random, metric: str, cond: list[float], stored: list[float],
               args: argparse.Namespace) -> tuple[str, int]:
    """One baseline verdict as BaselineGate.check reaches it: (status, candidate runs used)."""
    unit, direction, kind = metric_traits(metric)
    base = MetricSeries(unit, direction, kind, rng.sample(stored, max(2, len(stored) * 2 // 3)))
    pool = list(cond)
    rng.shuffle(pool)
    start = 1 if kind == "count" else args.repeats  # a count decides on one run; an interval needs two
    cand = [pool.pop() for _ in range(min(start, len(pool)))]
    design = Design(max_pairs=args.max_runs, first_look=start)

    def verdicts() -> list[MetricVerdict]:
        return [decide_metric("bench", "job", metric, base, MetricSeries(unit, direction, kind, cand),
                              Policy(), design)]

    def extend() -> None:
        cand.append(pool.pop() if pool else rng.choice(cond))

    regression.until_job_decided(verdicts, lambda: len(cand), extend, Budget(max_pairs=args.max_runs), Clock())
    return verdicts()[0].status, len(cand)


def analyse(data: dict[str, Any], args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    for strategy, d in data["strategies"].items():
        stored, rounds = d["stored"], d["rounds"]
        busy = [r["gpu_busy"] / r["step_time"] for r in stored if r.get("gpu_busy")]
        print(f"\n== {strategy}, {len(stored)} stored runs, {len(rounds)} rounds, collected in {d['seconds']:.0f} s"
              + (f"; GPU busy {min(busy):.0%}-{max(busy):.0%} of the step" if busy else ""))
        print(f"{'metric':<22} {'stored run-to-run':>18} {'identical':>9}   {'A/A false alarms':>24}   "
              f"{'changed: caught':>24}   {'runs (mean, max)':>16}")
        for metric in METRICS:
            values = [r.get(metric) for r in stored]
            if any(v is None for v in values):
                continue
            cv = relative_spread(values)
            same = len(set(values)) == 1
            cells = []
            for cond in ("A/A", "changed"):
                pool = [r[cond][metric] for r in rounds]
                trials = [gate_trial(rng, metric, pool, values, args) for _ in range(args.trials)]
                fails = sum(status == "fail" for status, _ in trials)
                lo, hi = wilson(fails, len(trials))
                used = [n for _, n in trials]
                cells.append((f"{fails / len(trials):6.1%} [{lo:.1%}, {hi:.1%}]", statistics.mean(used), max(used)))
            delta = statistics.median(r["changed"][metric] for r in rounds) / statistics.median(values) - 1
            print(f"{metric:<22} {('-' if cv is None else f'{cv:.3%}'):>18} {str(same):>9}   {cells[0][0]:>24}   "
                  f"{cells[1][0] + f' ({delta:+.1%})':>24}   {cells[1][1]:>6.2f}, {cells[1][2]:<3d}")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--strategy", default="ddp", help="comma-separated: ddp, fsdp2, deepspeed (ZeRO-3)")
    p.add_argument("--seq", type=int, default=64, help="sequence length of the base copy (the change adds 3 %%)")
    p.add_argument("--change", type=float, default=1.03,
                   help="sequence factor of the changed copy (GPU kernel time grows less than the FLOPs: tile "
                        "quantisation and kernels that do not scale with it)")
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--depth", type=int, default=24)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--stored", type=int, default=6)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2, help="candidate runs at a time figure's first look")
    p.add_argument("--max-runs", type=int, default=4, help="candidate runs at most")
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--json", help="write the recorded runs here")
    p.add_argument("--from-json", help="analyse recorded runs instead of collecting")
    args = p.parse_args(argv)
    data = json.loads(Path(args.from_json).read_text()) if args.from_json else collect(args)
    analyse(data, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
