"""Head against base (--distperf-against) beside the stored-baseline gate: false alarms, catch rate, pairs and
minutes per verdict, on a machine that drifts.

The project is this repository itself: a clone of it, with the user workload of examples/my_model.py run under DDP
(a user's model, not the built-in one). Commits made on the clone:
  base     the benchmark's fixed workload (WIDTH, DEPTH and a perf test file for the session timings);
  A/A      a no-op commit on base (`git commit --allow-empty`);
  host     base plus host-side Python work in each block's forward (about +30 % step time, the same FLOPs and
           operators: only wall time can see it; --host-work sizes it, the size is measured);
  deeper   base plus two more residual blocks (about +30 % step time and +33 % FLOPs);
  flops    base plus a slightly wider hidden layer (about +3 % FLOPs: a change wall time cannot resolve).
Each side runs from a git worktree of its commit made by the plugin's own `against.prepare` (the harness stays
this checkout's, as in a session), through the plugin's launcher: every run is a real job.

Collection (checkpointed to --pickle after every run; --resume continues one that was cut short):
  1. stored block: --stored runs of base on the quiet machine (the baseline saved "last week");
  2. quiet phase: --rounds rounds, each an interleaved pair (condition, base) per condition, order alternating;
  3. drift phase: the same with --hogs busy-looping processes started (a machine slower than when the baseline
     was saved: another job on the runner, a smaller cgroup share).
Analysis (re-sampling the recorded runs; --from-pickle re-analyses a collection):
  head vs base    the shipped AgainstGate: its first look at 3 pairs drawn from one phase's pairs of a condition,
                  then its own until_job_decided adding pairs (planned looks 3, 6, 12) while a time verdict is
                  undecided -- on the phase's pairs only, so drift common to a pair is what it faces.
  stored gate     the shipped BaselineGate decision (work_figures.gate_trial: decide_metric + until_job_decided):
                  the stored block against candidate runs drawn from a phase's condition runs.
  FAIL is an alarm: for A/A a false alarm, for a change a catch. Rates carry a 95 % Wilson interval over the
  --trials decisions; the intervals leave out the uncertainty of the finite pools the trials re-sample.
  Draws are without replacement while a pool lasts: a pool smaller than what a verdict asks for repeats pairs.
Sessions (--sessions): real `pytest --distperf` runs on the clone's perf test, timed: a stored-baseline save and
check, and --distperf-against on the A/A, host and deeper commits -- the wall time of a verdict, each way.

    python benchmarks/against_power.py --pickle /tmp/against.pkl --json benchmarks/results/against-cpu-2core.json
    python benchmarks/against_power.py --from-pickle /tmp/against.pkl
    python benchmarks/against_power.py --device cuda --world-size 1 --phases quiet --stored 3 --rounds 4 \\
        --flops-rounds 2 --json against-1xh200.json                                     # 1xH200: no drift phase
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.detection_power import run_once  # noqa: E402
from benchmarks.work_figures import gate_trial  # noqa: E402
from pytest_distperf.decide import against  # noqa: E402
from pytest_distperf.decide.policy import Policy  # noqa: E402
from pytest_distperf.decide.stopping import Clock  # noqa: E402
from pytest_distperf.launch.fingerprint import machine_class  # noqa: E402
from pytest_distperf.figures.quantities import run_step_time, run_work  # noqa: E402
from benchmarks.rates import wilson  # noqa: E402
from pytest_distperf.figures.stats import relative_spread  # noqa: E402
from pytest_distperf.rank.results import RunResult  # noqa: E402
from pytest_distperf.spec.job import FunctionRef, JobSpec  # noqa: E402

WIDTH, DEPTH, BATCH = 256, 6, 32
CONDITIONS = ("A/A", "host", "deeper", "flops")
TIMED = 3  # the conditions every round has; flops only the first --flops-rounds
TEST_FILE = "examples/test_against_bench.py"  # examples/ is on the ranks' sys.path, as for test_my_model.py
TEST = '''import pytest


@pytest.mark.distperf(world_size={world_size})
def test_user_model_ddp(distperf):
    distperf.measure(distperf.job("ddp", workload="my_model:make_workload",
                                  workload_kwargs={{"width": {width}, "depth": {depth}, "batch_size": {batch}}}))
'''
DEEPER = [("        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))",
           "        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth + 2)))  # the change: 2 more blocks")]
WIDER = [("        self.up = nn.Linear(width, 4 * width)\n        self.down = nn.Linear(4 * width, width)",
          "        self.up = nn.Linear(width, 4 * width + 32)  # the change: a wider hidden layer\n"
          "        self.down = nn.Linear(4 * width + 32, width)")]


def host_work(n: int) -> list[tuple[str, str]]:
    return [("class Block(nn.Module):",
             f"def host_work(n: int = {n}) -> int:  # the change: Python work on the host in every block\n"
             "    return sum(i * i for i in range(n))\n\n\nclass Block(nn.Module):"),
            ("        return x + self.down(F.gelu(self.up(self.norm(x))))",
             "        host_work()\n        return x + self.down(F.gelu(self.up(self.norm(x))))")]


def git(root: str, *args: str) -> str:
    return subprocess.run(["git", "-C", root, "-c", "user.name=bench", "-c", "user.email=bench@example.com", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def commit_change(root: str, branch: str, replace: list[tuple[str, str]] | None) -> None:
    git(root, "switch", "-q", "-c", branch, "base")
    if replace is None:
        git(root, "commit", "-q", "--allow-empty", "-m", f"{branch}: no change")
    else:
        path = os.path.join(root, "examples", "my_model.py")
        text = Path(path).read_text()
        for old, new in replace:
            if old not in text:
                raise SystemExit(f"examples/my_model.py no longer has {old.strip()!r}: update this benchmark")
            text = text.replace(old, new)
        Path(path).write_text(text)
        git(root, "commit", "-q", "-am", f"{branch}: the change under test")
    git(root, "switch", "-q", "base")


def make_project(folder: str, world_size: int, host: int) -> str:
    """A clone of this repository with the benchmark's commits on it."""
    root = os.path.join(folder, "project")
    subprocess.run(["git", "clone", "-q", str(ROOT), root], check=True)
    git(root, "switch", "-q", "-c", "base")
    Path(root, TEST_FILE).write_text(TEST.format(world_size=world_size, width=WIDTH, depth=DEPTH, batch=BATCH))
    git(root, "add", TEST_FILE)
    git(root, "commit", "-q", "-m", "base: the benchmark's perf test")
    commit_change(root, "A/A".replace("/", "-"), None)
    commit_change(root, "host", host_work(host))
    commit_change(root, "deeper", DEEPER)
    commit_change(root, "flops", WIDER)
    return root


def head_job(root: str, args: argparse.Namespace) -> JobSpec:
    """The job as a session on the clone makes it; each side gets it through its checkout (base_job)."""
    examples = os.path.join(root, "examples")
    return JobSpec(world_size=args.world_size, device=args.device, strategy="ddp",
                   workload=FunctionRef("my_model", "make_workload", file=os.path.join(examples, "my_model.py")),
                   workload_kwargs={"width": WIDTH, "depth": DEPTH, "batch_size": BATCH}, steps=args.steps, warmup_steps=3,
                   sys_path=[examples] + [p for p in sys.path if p])


def branch_of(condition: str) -> str:
    return condition.replace("/", "-")


class Hogs:
    """Busy-looping processes: the drift of a machine that got slower between the save and the check."""

    def __init__(self, count: int):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]

    def stop(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait()


def collect(args: argparse.Namespace, data: dict[str, Any]) -> dict[str, Any]:
    folder = tempfile.mkdtemp(prefix="against-bench-")
    root = make_project(folder, args.world_size, args.host_work)
    checkouts = {name: against.prepare(root, name, exact=True, parent=folder)
                 for name in ("base",) + tuple(branch_of(c) for c in CONDITIONS)}
    job = head_job(root, args)
    jobs = {name: c.base_job(job) for name, c in checkouts.items()}
    data.setdefault("stored", [])
    data.setdefault("phases", {phase: [] for phase in args.phases.split(",")})

    def save() -> None:
        Path(args.pickle).write_bytes(pickle.dumps(data))

    def run(name: str) -> RunResult:
        r = run_once(jobs[name], args.timeout)
        log(f"  {name}: {run_step_time(r) * 1e3:.1f} ms, wall {r.wall_seconds:.1f} s")
        return r

    try:
        while len(data["stored"]) < args.stored:
            log(f"stored {len(data['stored']) + 1}/{args.stored}")
            data["stored"].append(run("base"))
            save()
        for phase in data["phases"]:
            hogs = Hogs(args.hogs) if phase == "drift" else None
            try:
                rounds = data["phases"][phase]
                while len(rounds) < args.rounds:
                    i = len(rounds)
                    log(f"{phase} round {i + 1}/{args.rounds}")
                    rnd: dict[str, list[RunResult]] = {}
                    conditions = CONDITIONS if i < args.flops_rounds else CONDITIONS[:TIMED]
                    for j, cond in enumerate(conditions):
                        order = [branch_of(cond), "base"]
                        if (i + j) % 2:
                            order.reverse()
                        got = {name: run(name) for name in order}
                        rnd[cond] = [got[branch_of(cond)], got["base"]]  # (head, base)
                    rounds.append(rnd)
                    save()
            finally:
                if hogs:
                    hogs.stop()
        if args.sessions and "sessions" not in data:
            data["sessions"] = sessions(root, args)
            save()
    finally:
        for c in checkouts.values():
            c.remove()
    return data


def sessions(root: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Real pytest sessions on the clone's perf test: how long a verdict takes each way, with its outcome."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = []

    def session(branch: str, *flags: str) -> None:
        git(root, "switch", "-q", branch)
        report = os.path.join(root, "report.json")
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", TEST_FILE, "--distperf", "-p", "no:cacheprovider", "-q",
                               f"--distperf-json={report}", *flags], cwd=root, env=env, capture_output=True, text=True)
        wall = time.monotonic() - started
        verdicts = []
        if os.path.exists(report):
            doc = json.loads(Path(report).read_text())
            verdicts = [{k: v.get(k) for k in ("metric", "status", "delta", "current_runs", "baseline_runs")}
                        for t in doc.get("tests", []) for v in t.get("verdicts", [])]
            os.remove(report)
        tail = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
        out.append({"branch": branch, "flags": list(flags), "rc": done.returncode, "wall_seconds": wall,
                    "verdicts": verdicts, "summary": tail[0] if tail else done.stderr[-300:]})
        log(f"session {branch} {' '.join(flags)}: rc {done.returncode}, {wall:.0f} s; {out[-1]['summary']}")

    session("base", "--distperf-save")
    session("A-A")  # the stored-baseline gate on an unchanged commit
    session("A-A", "--distperf-against=base")
    session("host")
    session("host", "--distperf-against=base")
    session("deeper", "--distperf-against=base")
    return out


BENCH_MACHINE = machine_class("cpu", 2)  # the trials decide verdicts only; no report reads the machine


# -- analysis -----------------------------------------------------------------------------------------------------
def relative_trial(rng: random.Random, pairs: list[list[RunResult]], checkout: against.BaseCheckout,
                   job: JobSpec) -> tuple[dict[str, str], int]:
    """One head-vs-base verdict as a session reaches it: (status by metric, pairs used)."""
    gate = against.AgainstGate(checkout, TEST_FILE + "::test_user_model_ddp", Policy(), BENCH_MACHINE, {})
    pool = list(pairs)
    rng.shuffle(pool)

    def add() -> None:
        head, base = pool.pop() if pool else rng.choice(pairs)
        gate.add(job, head, base)

    for _ in range(gate.budget.first_look):
        add()
    verdicts = gate.check(job, [], extend=add, clock=Clock())
    return {v.metric: v.status for v in verdicts}, len(gate.jobs[next(iter(gate.jobs))].pairs)


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def rate(hits: int, n: int) -> str:
    lo, hi = wilson(hits, n)
    return f"{hits / n:6.1%} [{lo:.1%}, {hi:.1%}]"


def analyse(data: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    job = data["stored"][0].spec
    checkout = against.BaseCheckout(ref="base", exact=True, head_commit="0" * 40, base_commit="1" * 40,
                                    repo_root="/nonexistent", worktree="/nonexistent", harness_dir="/nonexistent/h")
    stored = [run_step_time(r) for r in data["stored"]]
    summary: dict[str, Any] = {"stored_ms": statistics.median(stored) * 1e3,
                               "stored_run_to_run": relative_spread(stored), "rows": []}
    walls = [r.wall_seconds for rnds in data["phases"].values() for rnd in rnds for pair in rnd.values() for r in pair]
    summary["run_wall_seconds"] = statistics.median(walls)
    print(f"stored block: {len(stored)} runs of base, step time {summary['stored_ms']:.1f} ms, run-to-run "
          f"{pct(summary['stored_run_to_run'])}; a run's wall time {summary['run_wall_seconds']:.1f} s (median)")
    print(f"\n{'phase':<6} {'condition':<8} {'pool Δ':>8} {'pair-to-pair':>12} | {'head vs base: step FAIL':>22} "
          f"{'any FAIL':>8} {'pairs':>6} {'min':>5} | {'stored gate: step FAIL':>22} {'runs':>5} {'min':>5}")
    for phase, rounds in data["phases"].items():
        for cond in CONDITIONS:
            pairs = [rnd[cond] for rnd in rounds if cond in rnd]
            if not pairs:
                continue
            ratios = [run_step_time(h) / run_step_time(b) for h, b in pairs]
            pool_delta = statistics.median(run_step_time(h) for h, _ in pairs) / statistics.median(
                run_step_time(b) for _, b in pairs) - 1
            rel = [relative_trial(rng, pairs, checkout, job) for _ in range(args.trials)]
            rel_fail = sum(s.get("step_time") == "fail" for s, _ in rel)
            rel_any = sum("fail" in s.values() for s, _ in rel)
            rel_pairs = statistics.mean(n for _, n in rel)
            cand = [run_step_time(h) for h, _ in pairs]
            gate = [gate_trial(rng, "step_time", cand, stored, args) for _ in range(args.trials)]
            gate_fail = sum(status == "fail" for status, _ in gate)
            gate_runs = statistics.mean(n for _, n in gate)
            # Minutes per verdict: a pair is two runs; the stored gate's verdict costs its candidate runs only
            # (the save was paid earlier, once per baseline).
            rel_min = rel_pairs * 2 * summary["run_wall_seconds"] / 60
            gate_min = gate_runs * summary["run_wall_seconds"] / 60
            row = {"phase": phase, "condition": cond, "pairs": len(pairs), "pool_delta": pool_delta,
                   "pair_to_pair": relative_spread(ratios), "relative_fail": rel_fail / args.trials,
                   "relative_fail_interval": wilson(rel_fail, args.trials), "relative_pairs": rel_pairs,
                   "relative_any_fail": rel_any / args.trials,
                   "gate_fail": gate_fail / args.trials, "gate_fail_interval": wilson(gate_fail, args.trials),
                   "gate_runs": gate_runs, "relative_minutes": rel_min, "gate_minutes": gate_min}
            if cond == "flops":
                first = [relative_trial_first_pair(pair, checkout, job) for pair in pairs]
                row["flops_first_pair_caught"] = sum(s.get("flops_per_step") == "fail" for s in first) / len(first)
                row["flops_first_pair_step_time"] = [s.get("step_time") for s in first]
                row["flops_delta"] = statistics.median(
                    (run_work(h)["flops_per_step"] / run_work(b)["flops_per_step"] - 1) for h, b in pairs)
            summary["rows"].append(row)
            print(f"{phase:<6} {cond:<8} {pool_delta:>+8.1%} {pct(row['pair_to_pair']):>12} | "
                  f"{rate(rel_fail, args.trials):>22} {rel_any / args.trials:>8.1%} {rel_pairs:>6.2f} {rel_min:>5.1f} | "
                  f"{rate(gate_fail, args.trials):>22} {gate_runs:>5.2f} {gate_min:>5.1f}")
            if cond == "flops":
                print(f"{'':<16} flops {row['flops_delta']:+.2%}: head vs base flops_per_step FAIL at the first pair "
                      f"in {row['flops_first_pair_caught']:.0%} of {len(first)} pairs (step time then: "
                      f"{', '.join(sorted(set(map(str, row['flops_first_pair_step_time']))))})")
    for s in data.get("sessions", []):
        steps = [v for v in s["verdicts"] if v["metric"] == "step_time"]
        v = steps[0] if steps else {}
        print(f"session {s['branch']:<7} {' '.join(s['flags']):<26} rc {s['rc']}  {s['wall_seconds']:>5.0f} s  "
              f"step_time {v.get('status')} ({(v.get('delta') or 0):+.1%}, {v.get('current_runs')} runs)  "
              f"{s['summary']}")
    summary["sessions"] = data.get("sessions", [])
    return summary


def relative_trial_first_pair(pair: list[RunResult], checkout: against.BaseCheckout, job: JobSpec) -> dict[str, str]:
    """The verdicts on one pair, as the first pair of a session has them (no extension)."""
    gate = against.AgainstGate(checkout, "bench::first_pair", Policy(), BENCH_MACHINE, {})
    gate.add(job, *pair)
    return {v.metric: v.status for v in gate.check(job, [])}


def with_run_ids(data: dict[str, Any]) -> dict[str, Any]:
    """A collection pickled before runs had ids: each run gets its own (unpickling skips the default)."""
    runs = list(data.get("stored", [])) + [r for rnds in data.get("phases", {}).values() for rnd in rnds
                                           for pair in rnd.values() for r in pair]
    for run in runs:
        if "id" not in vars(run):
            run.id = uuid.uuid4().hex
    return data


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stored", type=int, default=8)
    p.add_argument("--rounds", type=int, default=12, help="rounds a phase (quiet, drift)")
    p.add_argument("--flops-rounds", type=int, default=3, help="rounds a phase with a flops pair")
    p.add_argument("--hogs", type=int, default=1, help="busy-looping processes during the drift phase")
    p.add_argument("--phases", default="quiet,drift", help="quiet, drift or both")
    p.add_argument("--host-work", type=int, default=30000, help="the host commit's Python loop a block")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--trials", type=int, default=400)
    p.add_argument("--repeats", type=int, default=3, help="the stored gate's first candidate runs")
    p.add_argument("--max-runs", type=int, default=12, help="the stored gate's most candidate runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sessions", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--pickle", default=os.path.join(tempfile.gettempdir(), "against-power.pkl"))
    p.add_argument("--resume", action="store_true")
    p.add_argument("--from-pickle")
    p.add_argument("--json", help="write the analysis here")
    args = p.parse_args(argv)
    if args.from_pickle:
        data = with_run_ids(pickle.loads(Path(args.from_pickle).read_bytes()))
    else:
        data = pickle.loads(Path(args.pickle).read_bytes()) if args.resume and os.path.exists(args.pickle) else {}
        started = time.monotonic()
        data = collect(args, data)
        data["collect_seconds"] = data.get("collect_seconds", 0) + time.monotonic() - started
    summary = analyse(data, args)
    summary["args"] = {k: v for k, v in vars(args).items()}
    summary["collect_seconds"] = data.get("collect_seconds")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
