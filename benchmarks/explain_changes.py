"""What a failed verdict says changed: code changes written here, each gated against one stored baseline.

A user step (written below into a scratch project) trains a small MLP; `DP_CHANGE` picks one code change inside it:

- `none`: the same code again (A/A): no row may stand out of its noise;
- `extra_op`: one more operator in the step (a sort of a large tensor);
- `block_op`: one more operator in one block's forward (a sort of its activations, in a module of its own): the
  op row and the module row it ran under;
- `dtype`: the MLP's forward and backward in float64 instead of float32;
- `collective`: one more all-reduce per step (gloo on CPU, NCCL on CUDA);
- `host_loop`: a Python loop on the host inside the step (no operator);
- `extra_layer`: one more Linear layer in the model's third block (more FLOPs, under a module of its own).

The baseline is saved once from `none` (`--distperf-save`); every change then runs the stored gate with
`distperf_explain` on, and the JSON report's explanation is read back. Printed per change: the verdicts that
failed, the explanation's top rows (count and time per step on both sides, change, beyond noise or not), and the
work phase's added cost (the rows are built from the profiler pass that already runs; `benchmarks/overhead.py`
measures that pass) is not re-measured here. The baseline file's size with and without the tables is printed too,
and each JSON report's size with the explanation's share (written once a job, however many verdicts it explains).

    python benchmarks/explain_changes.py --device cpu                      # 2 gloo ranks
    python benchmarks/explain_changes.py --device cuda --world-size 1      # 1xH200
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_distperf.figures.explain import Explanation  # noqa: E402

CHANGES = ("none", "extra_op", "block_op", "dtype", "collective", "host_loop", "extra_layer")

STEP = '''
import os

import torch
import torch.distributed as dist


class SortedToo(torch.nn.Module):  # block_op: one block sorts its activations too
    def forward(self, x):
        return x + torch.sort(x, dim=-1).values * 0


def stepper(width):
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    change = os.environ.get("DP_CHANGE", "none")
    dtype = torch.float64 if change == "dtype" else torch.float32
    blocks = [torch.nn.Sequential(torch.nn.Linear(width, width)) for _ in range(4)]
    if change == "extra_layer":
        blocks[2].append(torch.nn.Linear(width, width))
    if change == "block_op":
        blocks[2].append(SortedToo())
    model = torch.nn.Sequential(*blocks).to(device=device, dtype=dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(64, width, device=device, dtype=dtype)
    big = torch.randn(1 << 20, device=device)
    grad = torch.ones(1 << 16, device=device)

    def step():
        loss = model(x).square().mean()
        loss.backward()
        if change == "extra_op":
            torch.sort(big)
        if change == "collective":
            dist.all_reduce(grad)
        if change == "host_loop":
            total = 0
            for i in range(20000):
                total += i * i
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step
'''

TEST = '''
import pytest
from usersteps import stepper


@pytest.mark.distperf(repeats=3)
def test_step(distperf):
    distperf.measure(distperf.step_job(stepper, args=({width},), steps={steps}, warmup=2))
'''


def session(project: Path, args: argparse.Namespace, *extra: str, env: dict[str, str] | None = None,
            ) -> tuple[int, str, float]:
    """A pytest --distperf session in `project` on args.device and args.world_size: (exit status, output, seconds).
    benchmarks/script_jobs.py runs its sessions with it too."""
    path = os.pathsep.join(p for p in (str(project), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, **(env or {}), "PYTHONPATH": path}  # what was on it (an installed plugin) stays
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "--distperf", f"--distperf-device={args.device}",
                           f"--distperf-world-size={args.world_size}", "-p", "no:cacheprovider", "-q",
                           "--distperf-max-repeats=6", *extra], cwd=project, env=env, capture_output=True,
                          text=True, timeout=args.timeout)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--world-size", type=int)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--changes", default=",".join(CHANGES))
    p.add_argument("--rows", type=int, default=3, help="top rows printed per change")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--json", help="write every change's outcome and whole explanation here")
    args = p.parse_args(argv)
    args.world_size = args.world_size or (2 if args.device == "cpu" else 1)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="distperf-explain-") as folder:
        project = Path(folder)
        (project / "usersteps.py").write_text(STEP)
        (project / "test_changes.py").write_text(TEST.format(width=args.width, steps=args.steps))
        rc, out, seconds = session(project, args, "--distperf-save", env={"DP_CHANGE": "none"})
        if rc != 0:
            print(out[-4000:])
            raise SystemExit(f"saving the baseline failed (exit {rc})")
        baseline = next((project / "baselines").rglob("*.json"), None)
        size = baseline.stat().st_size if baseline else 0
        without = 0
        if baseline:
            doc = json.loads(baseline.read_text())
            for job in doc.get("jobs", {}).values():
                job.pop("explain", None)
            without = len(json.dumps(doc, indent=2))
        print(f"baseline saved in {seconds:.0f} s: {size} bytes, {without} without the tables "
              f"(+{size - without} bytes)", flush=True)
        for change in args.changes.split(","):
            report = project / f"{change}.json"
            rc, out, seconds = session(project, args, "-o", "distperf_explain=true", f"--distperf-json={report}",
                                       env={"DP_CHANGE": change})
            test = json.loads(report.read_text())["tests"][0] if report.exists() else {}
            failed = [v["metric"] for v in test.get("verdicts", []) if v.get("fails")]
            explanation = next(iter((test.get("explanations") or {}).values()), None) or {}
            report_bytes = report.stat().st_size if report.exists() else 0
            explanation_bytes = len(json.dumps(test.get("explanations") or {}, indent=2))
            rows = explanation.get("rows", [])
            beyond = [r for r in rows if r.get("beyond_noise") or r.get("count_changed")]
            print(f"\n== {change}: exit {rc} in {seconds:.0f} s; failed: {', '.join(failed) or 'none'}; "
                  f"{len(beyond)} of {len(rows)} rows stand out (time beyond noise or count changed); JSON report "
                  f"{report_bytes} bytes, the explanation {explanation_bytes} of them", flush=True)
            for line in Explanation.from_json(explanation).lines(top=args.rows) if explanation else []:
                print(f"   {line}")
            if not explanation:
                print(out[-2000:])
            results[change] = {"exit": rc, "seconds": seconds, "failed": failed, "explanation": explanation,
                               "report_bytes": report_bytes, "explanation_bytes": explanation_bytes}
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "baseline_bytes": size,
                                               "baseline_bytes_without_tables": without, "changes": results},
                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
