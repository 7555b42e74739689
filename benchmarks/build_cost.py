"""Where a job's build goes: one rank's `prepare.build` (model, strategy engine, batches) under cProfile.

A run's split (figures/quantities.run_time_split) says how long the build took; this says in which functions, so
what is the harness's (model init, batches, config checks) can be told from what is the library's (DeepSpeed's
partitioning, its optimizer set-up). One process, world size 1, the process group started here.

    python benchmarks/build_cost.py --device cuda --strategy deepspeed --options '{"stage": 3}' --shape 1b
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--strategy", default="deepspeed")
    p.add_argument("--options", default='{"stage": 3}', help="strategy options, JSON")
    p.add_argument("--shape", default="1b")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)

    import torch
    import torch.distributed as dist

    from pytest_distperf import strategies
    from pytest_distperf.launch.nodes import free_port
    from pytest_distperf.rank import prepare
    from pytest_distperf.spec.job import JobSpec

    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(free_port()))
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    options = json.loads(args.options)
    job = JobSpec(world_size=1, device=args.device, strategy=args.strategy, options=options, shape=args.shape,
                  full_options=strategies.validate(args.strategy, options))
    job = JobSpec(**{**job.__dict__, "adapter": strategies.adapter_module(args.strategy)})
    with tempfile.TemporaryDirectory() as scratch:
        started = time.perf_counter()
        loaded = prepare.load(job, 0, 0, device, scratch)
        loaded_s = time.perf_counter() - started
        prof = cProfile.Profile()
        started = time.perf_counter()
        prof.enable()
        prepared = prepare.build(loaded)
        if device.type == "cuda":
            torch.cuda.synchronize()
        prof.disable()
        build_s = time.perf_counter() - started
        started = time.perf_counter()
        prepared.adapter.step(*prepared.batches[0])
        if device.type == "cuda":
            torch.cuda.synchronize()
        first_step_s = time.perf_counter() - started
    print(f"{job.describe()}: imports {loaded_s:.1f} s, build {build_s:.1f} s, first step {first_step_s:.1f} s")
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(args.top)
        print(f"--- build, by {key} ---")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
