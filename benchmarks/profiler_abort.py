"""Does the work phase's profiler corrupt the heap without the warm agent? A gloo DDP pair of ranks started fresh
(torch.multiprocessing `spawn`, or `fork` from a parent that imported what the warm agent preloads) runs N
profiled sessions each, as rank/work.py does on CPU: `profile(activities=[CPU], profile_memory=True)` around 3
steps under a `record_function`, then `export_chrome_trace` and a JSON load. Prints each round's exit codes and
the count of rounds a rank died in (a negative exit code: the signal).

    python benchmarks/profiler_abort.py [--rounds 10] [--sessions 300] [--start spawn|fork] [--preload deepspeed,accelerate]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import tempfile


def rank(r: int, world: int, sessions: int, port: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=r, world_size=world)
    model = torch.nn.Sequential(torch.nn.Embedding(512, 64), torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 512))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters())
    x = torch.randint(0, 512, (8, 64))

    def step() -> None:
        opt.zero_grad()
        ddp(x).float().logsumexp(-1).mean().backward()
        opt.step()

    for _ in range(sessions):
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            for _ in range(3):
                with record_function("distperf.step"):
                    step()
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        prof.export_chrome_trace(path)
        with open(path) as f:
            json.load(f)
        os.remove(path)
    dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--sessions", type=int, default=300, help="profiled sessions per rank per round")
    ap.add_argument("--start", choices=("spawn", "fork"), default="spawn")
    ap.add_argument("--preload", default="", help="modules the parent imports first (with --start fork)")
    args = ap.parse_args()
    for name in filter(None, args.preload.split(",")):
        importlib.import_module(name)
    import torch.multiprocessing as mp

    ctx = mp.get_context(args.start)
    died = 0
    for i in range(args.rounds):
        port = random.randint(20000, 60000)
        procs = [ctx.Process(target=rank, args=(r, 2, args.sessions, port)) for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
        codes = [p.exitcode for p in procs]
        died += any(c != 0 for c in codes)
        print(f"round {i + 1}: exit codes {codes}", flush=True)
    print(f"{args.rounds} rounds x 2 ranks x {args.sessions} profiled sessions ({args.start}"
          f"{', preloaded ' + args.preload if args.preload else ''}): {died} round(s) with a rank that died")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
