"""How far bf16 moves a loss curve: the noise floor that `assert_losses_match` on CUDA is argued from.

perf_tests/test_zero3.py's `trains_like` check compares ZeRO-3's and FSDP2's losses step by step (same seed, same
batches). On CUDA both sides compute in bf16 over fp32 master weights, each engine rounding in its own places, so
their curves differ by rounding even where both train correctly. This measures that rounding: each strategy
with the harness's precision policy (bf16 compute) and in fp32 on the same model, seed and batches, and
prints, per strategy, the largest relative loss difference between its bf16 and its fp32 run over the job's timed
steps, plus the two strategies against each other in bf16 and in fp32.

Why that bounds the check: step by step, |A - B| <= |A - A32| + |A32 - B32| + |B32 - B| (the triangle inequality
through each side's fp32 run). The first and last terms are bf16's rounding of each strategy (d_zero3, d_fsdp2); the
middle one is how far two correct engines drift apart in fp32 on this device (on CUDA atomics make a run's
reductions land in their own order, and the drift grows with the steps): the bound is d_zero3 + fp32 gap + d_fsdp2.
Each configuration runs `--repeats` times: every term is the worst over its run pairs, as the check takes the worst over
its own run pairs, and the same strategy against itself (A/A) shows how much of a term is run-to-run drift alone.

    python benchmarks/loss_noise.py --device cuda --world-size 1 --shape 1b [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.detection_power import run_once  # noqa: E402
from pytest_distperf.figures.stats import max_relative_difference  # noqa: E402
from pytest_distperf.spec.job import FunctionRef, JobSpec  # noqa: E402

MODULE = "distperf_loss_noise_workload"
# The built-in GPT as a user's workload, so the precision can be set; the same model, seed and batches.
WORKLOAD = '''
import dataclasses

from pytest_distperf.rank.workload import builtin_workload, resolve_shape


def make_workload(shape, seed, precision):
    return dataclasses.replace(builtin_workload(resolve_shape(shape), seed), precision=precision)
'''
STRATEGIES = {"zero3": ("deepspeed", {"stage": 3}), "fsdp2": ("fsdp2", {})}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--shape", default="1b")
    p.add_argument("--steps", type=int, default=20, help="timed steps (the test's on CUDA)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each strategy and precision")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json")
    args = p.parse_args(argv)
    losses: dict[str, list[list[float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, f"{MODULE}.py").write_text(WORKLOAD)
        for repeat in range(args.repeats):
            for name, (strategy, options) in STRATEGIES.items():
                for precision in ("auto", "fp32"):
                    job = JobSpec(world_size=args.world_size, device=args.device, strategy=strategy,
                                  options=options, workload=FunctionRef(MODULE, "make_workload"), steps=args.steps,
                                  work_steps=0, workload_kwargs={"shape": args.shape, "seed": 1234,
                                                                 "precision": precision},
                                  sys_path=[folder] + list(sys.path))
                    started = time.monotonic()
                    run = run_once(job, args.timeout)
                    losses.setdefault(f"{name}/{precision}", []).append(run.losses)
                    print(f"{name} {precision} run {repeat + 1}: {time.monotonic() - started:.0f} s, losses "
                          f"{[round(x, 5) for x in run.losses]}", flush=True)

    def worst(a: str, b: str) -> float:
        """The largest relative loss difference over every run pair of a and b (distinct runs when a is b)."""
        return max((max_relative_difference(x, y) for i, x in enumerate(losses[a]) for j, y in enumerate(losses[b])
                    if a != b or i < j), default=0.0)

    rows = {
        "zero3 bf16 vs fp32": ("zero3/auto", "zero3/fp32"),
        "fsdp2 bf16 vs fp32": ("fsdp2/auto", "fsdp2/fp32"),
        "zero3 vs fsdp2, fp32": ("zero3/fp32", "fsdp2/fp32"),
        "zero3 vs fsdp2, bf16": ("zero3/auto", "fsdp2/auto"),
        "zero3 A/A, bf16": ("zero3/auto", "zero3/auto"),
        "zero3 A/A, fp32": ("zero3/fp32", "zero3/fp32"),
        "fsdp2 A/A, bf16": ("fsdp2/auto", "fsdp2/auto"),
        "fsdp2 A/A, fp32": ("fsdp2/fp32", "fsdp2/fp32"),
    }
    diffs = {label: worst(a, b) for label, (a, b) in rows.items()}
    for label, d in diffs.items():
        print(f"{label:24s} max relative loss difference {d:.3e}")
    bound = diffs["zero3 bf16 vs fp32"] + diffs["zero3 vs fsdp2, fp32"] + diffs["fsdp2 bf16 vs fp32"]
    print(f"bound (d_zero3 + fp32 gap + d_fsdp2) {bound:.3e}; zero3 vs fsdp2 in bf16 is "
          f"{'within' if diffs['zero3 vs fsdp2, bf16'] <= bound else 'BEYOND'} it")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "losses": losses, "diffs": diffs,
                                               "bound": bound}, indent=1))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
