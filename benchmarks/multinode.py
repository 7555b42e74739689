"""Multi-node figures on one machine: the same tiny DDP job through the local launcher, two torchrun node
agents on loopback, and a SLURM job of two node agents; then faults across "nodes".

    python benchmarks/multinode.py [--device cpu|cuda] [--shape tiny] [--runs 3] [--slurm-partition P]
                                   [--slurm-agents-per-node 2] [--timeout-probe 20] [--json PATH]

Prints, per launcher: wall time from launch (SLURM: submission) to verdict, and whether the per-rank
losses are identical to the local launcher's. Faults: a node agent SIGKILLed mid-job (time from the kill
to the failed verdict, processes and SLURM jobs left behind), and a SLURM job past its timeout (time past
the timeout to the verdict, SLURM jobs left). Without --slurm-partition (or DISTPERF_TEST_SLURM_PARTITION)
the SLURM rows are left out. Start the one-host cluster with `eval "$(.ci/services/slurm.sh start)"`.

--device cuda: 2 GPUs, one per node agent (the torchrun agents split CUDA_VISIBLE_DEVICES); with
NCCL_SOCKET_IFNAME=lo NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 set for every launcher, NCCL takes its
network path over loopback, as between two nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_distperf.errors import JobError  # noqa: E402
from pytest_distperf.launch.base import LocalLauncher  # noqa: E402
from pytest_distperf.launch.slurm import SlurmLauncher  # noqa: E402
from pytest_distperf.launch.torchrun import TorchrunLauncher  # noqa: E402
from pytest_distperf.spec.job import FunctionRef, JobSpec  # noqa: E402

MODULE = "distperf_multinode_bench"
TAG = "DISTPERF_MULTINODE_BENCH_TAG"


def kill_agent_one(stamp: str) -> int:
    """In the ranks: the rank on node agent 1 SIGKILLs its agent after a first barrier; rank 0 is in a long step."""
    import torch.distributed as dist

    dist.barrier()
    if os.environ.get("DISTPERF_AGENT_INDEX") == "1":
        with open(stamp, "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(300)
    dist.barrier()
    return dist.get_rank()


def hang() -> int:
    import torch.distributed as dist

    dist.barrier()
    time.sleep(3600)
    return 0


def tagged(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(TAG) == tag:
                out.append(p)
        except psutil.Error:
            pass
    return out


def slurm_jobs_left() -> int:
    out = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, timeout=30).stdout
    return sum(1 for name in out.split() if name.startswith("distperf-"))


def left_after(tag: str, settle: float = 5.0) -> int:
    deadline = time.monotonic() + settle
    while tagged(tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    return len(tagged(tag))


DEVICE = "cpu"
SHAPE = "tiny"


def ddp_job() -> JobSpec:
    return JobSpec(world_size=2, device=DEVICE, strategy="ddp", shape=SHAPE, steps=5, warmup_steps=2,
                   sys_path=[str(ROOT)])


def fn_job(name: str, *args: object) -> JobSpec:
    return JobSpec(world_size=2, device=DEVICE, function=FunctionRef(MODULE, name, __file__), args=args,
                   sys_path=[str(ROOT)])


def timed_runs(launcher, runs: int, base: str) -> tuple[list[float], list[list[float]]]:
    seconds, losses = [], []
    for _ in range(runs):
        start = time.monotonic()
        values = launcher.launch(ddp_job(), timeout=600, base_dir=base)
        seconds.append(time.monotonic() - start)
        losses.append([values[r].losses for r in sorted(values)])
    return seconds, losses


def kill_fault(launcher, base: str) -> dict[str, object]:
    tag = uuid.uuid4().hex
    os.environ[TAG] = tag
    stamp = os.path.join(base, f"killed-{tag}.txt")
    try:
        launcher.launch(fn_job("kill_agent_one", stamp), timeout=300, base_dir=base)
        verdict = "PASSED (wrong)"
    except JobError as e:
        verdict = str(e).splitlines()[0]
    ended = time.time()
    figures: dict[str, object] = {"verdict": verdict, "processes_left": left_after(tag)}
    figures["seconds_to_failure"] = round(ended - float(open(stamp).read()), 2) if os.path.exists(stamp) else None
    return figures


def timeout_fault(launcher, base: str, timeout: float) -> dict[str, object]:
    tag = uuid.uuid4().hex
    os.environ[TAG] = tag
    start = time.monotonic()
    try:
        launcher.launch(fn_job("hang"), timeout=timeout, base_dir=base)
        verdict = "PASSED (wrong)"
    except JobError as e:
        verdict = str(e).splitlines()[0]
    return {"verdict": verdict, "seconds_to_verdict": round(time.monotonic() - start, 2),
            "processes_left": left_after(tag)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--shape", default="tiny", help="workload shape of the DDP job")
    p.add_argument("--runs", type=int, default=3, help="timed runs per launcher")
    p.add_argument("--slurm-partition", default=os.environ.get("DISTPERF_TEST_SLURM_PARTITION"))
    p.add_argument("--slurm-agents-per-node", type=int, default=2, help="2: two node agents on one SLURM node")
    p.add_argument("--timeout-probe", type=float, default=20.0, help="timeout of the SLURM timeout fault, s")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    global DEVICE, SHAPE
    DEVICE, SHAPE = args.device, args.shape

    base = tempfile.mkdtemp(prefix="distperf-multinode-")
    launchers = {"local": LocalLauncher(), "torchrun x2 agents": TorchrunLauncher(nodes=2)}
    if args.slurm_partition:
        launchers["slurm x2 agents"] = SlurmLauncher(nodes=2, partition=args.slurm_partition, cpus_per_task=1,
                                                     agents_per_node=args.slurm_agents_per_node)
    figures: dict[str, dict[str, object]] = {}
    reference = None
    print(f"{DEVICE} ddp {SHAPE} x2, 5 steps")
    print(f"{'launcher':<20} {'runs':>4} {'to verdict: median':>19} {'min':>7} {'max':>7}  losses vs local")
    for name, launcher in launchers.items():
        seconds, losses = timed_runs(launcher, args.runs, base)
        reference = reference or losses[0]
        same = all(run == reference for run in losses)
        worst = max(abs(a - b) for run in losses for ra, rb in zip(run, reference) for a, b in zip(ra, rb))
        figures[name] = {"seconds": [round(s, 2) for s in seconds], "losses_identical_to_local": same,
                         "max_abs_loss_difference": worst, "losses": losses[0]}
        print(f"{name:<20} {len(seconds):>4} {statistics.median(seconds):>17.1f} s {min(seconds):>5.1f} s "
              f"{max(seconds):>5.1f} s  {'identical' if same else f'DIFFERENT (max |d| {worst:.3g})'}")

    print("\nfaults")
    for name, launcher in launchers.items():
        if name == "local":
            continue
        f = kill_fault(launcher, base)
        if isinstance(launcher, SlurmLauncher):
            f["slurm_jobs_left"] = slurm_jobs_left()
        figures[f"{name}: agent 1 SIGKILLed"] = f
        print(f"{name}: agent 1 SIGKILLed -> failed after {f['seconds_to_failure']} s; processes left "
              f"{f['processes_left']}" + (f", SLURM jobs left {f['slurm_jobs_left']}" if "slurm_jobs_left" in f else "")
              + f"\n    {f['verdict']}")
    if args.slurm_partition:
        f = timeout_fault(launchers["slurm x2 agents"], base, args.timeout_probe)
        f["slurm_jobs_left"] = slurm_jobs_left()
        figures["slurm x2 agents: timeout"] = f
        print(f"slurm x2 agents: hang, timeout {args.timeout_probe:g} s -> verdict after {f['seconds_to_verdict']} s "
              f"(queue + start + timeout + stacks + scancel); processes left {f['processes_left']}, "
              f"SLURM jobs left {f['slurm_jobs_left']}\n    {f['verdict']}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
