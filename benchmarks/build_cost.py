"""Where a run's fixed cost goes: one rank's `prepare.build` (model, strategy engine, batches) and, with
`--after`, the phases after timing (the work phase, the step breakdown), each under cProfile.

A run's split (figures/quantities.run_time_split) says how long the build and the phases after timing took; this
says in which functions, so what is the harness's (model init, batches, config checks, the profiler's start and
stop, the trace's export and read) can be told from what is the library's (DeepSpeed's partitioning, its optimizer
set-up). One process, world size 1, the process group started here; a fresh process is a run's first profiler
start (CUPTI's set-up), so the work phase is timed as a run pays it, again with the profiler warm, and a third
time under cProfile.

    python benchmarks/build_cost.py --device cuda --strategy deepspeed --options '{"stage": 3}' --shape 1b
    python benchmarks/build_cost.py --device cuda --strategy fsdp2 --options '{}' --shape 1b --after --trace t.json
    python benchmarks/build_cost.py --table t.json        # anywhere: read and table a kept trace, collector on/paused
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--strategy", default="deepspeed")
    p.add_argument("--options", default='{"stage": 3}', help="strategy options, JSON")
    p.add_argument("--shape", default="1b")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--after", action="store_true", help="also the phases after timing, split and profiled")
    p.add_argument("--trace", help="--after: keep the work phase's Chrome trace here")
    p.add_argument("--warmup", type=int, default=3, help="steps before the phases after timing (--after)")
    p.add_argument("--table", metavar="TRACE", help="only read and table a kept trace (.json: gunzip -k what "
                   "gpu_checks.sh gzipped) as the work phase does, with Python's cyclic collector on and paused; "
                   "no process group, no GPU")
    p.add_argument("--repeats", type=int, default=3, help="--table: times each way")
    args = p.parse_args(argv)
    if args.table:
        return table(args.table, args.repeats)

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
        warmup_s = []  # each warm-up step, synchronised: the first step's one-time costs apart from a steady step
        for batch in prepared.batches[:job.warmup_steps]:
            started = time.perf_counter()
            prepared.adapter.step(*batch)
            if device.type == "cuda":
                torch.cuda.synchronize()
            warmup_s.append(time.perf_counter() - started)
        print(f"{job.describe()}: imports {loaded_s:.1f} s, build {build_s:.1f} s, warm-up steps "
              f"{', '.join(f'{s:.2f}' for s in warmup_s)} s")
        show(prof, "build", args.top)
        if args.after:
            after(job, prepared, device, args)
    dist.destroy_process_group()
    return 0


def table(path: str, repeats: int) -> int:
    """Read a kept work-phase trace and build its time table (both families: CUDA's and CPU's), `repeats` times
    with the collector on (as the work phase read it before 36c3f2b) and paused (as it does since); the median of
    each, then both tables as one JSON line, to compare line against line with another commit's rows."""
    import contextlib
    import statistics

    from pytest_distperf.rank.probes.trace import Trace, collector_paused, load
    from pytest_distperf.rank.time_table import rank_table

    tables = {}
    for label, context in (("collector on", contextlib.nullcontext), ("collector paused", collector_paused)):
        seconds = []
        for _ in range(repeats):
            with context():
                started = time.perf_counter()
                trace = Trace(load(path))
                tables = {cuda: rank_table(trace, cuda) for cuda in (True, False)}
                seconds.append(time.perf_counter() - started)
            del trace
        print(f"{label}: read + tables {statistics.median(seconds):.2f} s (median of {repeats}: "
              f"{', '.join(f'{s:.2f}' for s in seconds)})")
    print(f"{path}: {len(tables[True])} rows (CUDA table), {len(tables[False])} rows (CPU table)")
    print(json.dumps({str(k): v for k, v in tables.items()}, sort_keys=True))
    return 0


def show(prof: cProfile.Profile, what: str, top: int) -> None:
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(top)
        print(f"--- {what}, by {key} ---")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])


def after(job: "JobSpec", prepared: Any, device: Any, args: argparse.Namespace) -> None:
    """The phases after timing as rank/worker.py runs them, each timed; the work phase under cProfile."""
    from pytest_distperf.rank import breakdown, work
    from pytest_distperf.rank.timing import StepTimer

    timer = StepTimer(device)
    trainer, batches = prepared.adapter, prepared.batches[job.warmup_steps:]

    def step(i: int) -> Any:
        return trainer.step(*batches[i % len(batches)])

    def seconds(fn: Any) -> float:
        timer.sync()
        started = time.perf_counter()
        fn()
        timer.sync()
        return time.perf_counter() - started

    for i in range(max(0, args.warmup - job.warmup_steps)):  # main() ran the job's warm-up steps
        step(i)
    plain = seconds(lambda: [step(i) for i in range(job.work_steps)])
    first = seconds(lambda: work.measure(step, job.work_steps, timer.sync, device, counts=False))
    again = seconds(lambda: work.measure(step, job.work_steps, timer.sync, device, counts=False))
    counts = seconds(lambda: work.measure(step, job.work_steps, timer.sync, device, counts=True)) - again
    split = seconds(lambda: breakdown.collect(trainer, batches))
    print(f"after timing: {job.work_steps} plain steps {plain:.2f} s; work phase {first:.2f} s a run "
          f"(again in the same process {again:.2f} s); counting pass (a job's first run) {counts:.2f} s; "
          f"step breakdown (a job's first run) {split:.2f} s")
    if args.trace:  # the work phase's trace kept, for Perfetto or to table it again elsewhere
        export = work.export
        work.export = lambda prof, complete_only=True: export(prof, args.trace, complete_only)
    prof = cProfile.Profile()
    prof.enable()
    work.measure(step, job.work_steps, timer.sync, device, counts=False)
    prof.disable()
    show(prof, "work phase (profiler warm)", args.top)


if __name__ == "__main__":
    raise SystemExit(main())
