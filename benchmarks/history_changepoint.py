"""A history of real sessions with one injected step change, and the change point the history command finds.

Every session is a real `pytest --distperf` run of one small perf test (a DDP job measured `--repeats` times,
CPU + gloo by default) in a scratch git repository, one commit per session; its `--distperf-json` report is
appended to the history with `history.record_session`, so the commit is the one the plugin itself read. From
session `--step-at` on the job carries real extra matmul work inside each step (`Shape.extra_work`, which the
job's label and configuration hash leave out, as a code change would). Then it prints what
`python -m pytest_distperf history DB --points` prints for the job's metrics (step time, peak memory, optimizer
state bytes); `--json PATH` keeps the trends and change points.

    python benchmarks/history_changepoint.py                                  # 24 sessions, step at 12
    python benchmarks/history_changepoint.py --sessions 30 --step-at 20 --extra-work 0.3 --db history.db
    python benchmarks/history_changepoint.py --db history.db --sessions 6 --step-at 0  # more sessions, all slower
    python benchmarks/history_changepoint.py --db history.db --analyse-only   # the command on a kept history

`--replay REPORT` builds the history from one real `--distperf-json` document instead, in seconds: each session
is that document with every step time scaled by its own factor (normal, sd `--noise`) and by 1 + `--step` from
`--step-at` on, under a made-up commit. Replayed, not measured: it shows what the search finds in a series of
known shape and noise, not what a machine measures.

    python benchmarks/history_changepoint.py --replay tests/data/history_report_zero3_cpu.json --step 0.15
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

TEST_FILE = '''\
import os

import pytest


@pytest.mark.distperf(world_size={world_size})
def test_step(distperf):
    extra = float(os.environ.get("DISTPERF_BENCH_EXTRA_WORK", "0"))
    job = distperf.job("{strategy}", shape={shape!r}, shape_overrides={{"extra_work": extra}} if extra else None)
    distperf.measure(job, repeats={repeats})
'''


def git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, "-c", "user.name=distperf-bench", "-c", "user.email=bench@localhost",
                           *args], check=True, capture_output=True, text=True).stdout.strip()


def run_sessions(args: argparse.Namespace, db: str) -> None:
    from pytest_distperf.store.history import record_session

    repo = tempfile.mkdtemp(prefix="distperf-history-bench-")
    with open(os.path.join(repo, "test_bench.py"), "w", encoding="utf-8") as f:
        f.write(TEST_FILE.format(world_size=args.world_size, strategy=args.strategy, repeats=args.repeats,
                                 shape=args.shape))
    git(repo, "init", "-q")
    print(f"sessions in {repo}, history {db}", flush=True)
    print(f"{'session':>7}  {'commit':<12}  {'extra_work':>10}  {'step_time (median of runs)':>26}  wall", flush=True)
    for i in range(args.sessions):
        extra = args.extra_work if i >= args.step_at else 0.0
        with open(os.path.join(repo, "session.txt"), "w", encoding="utf-8") as f:
            f.write(f"session {i} extra_work {extra}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"session {i}" + (f" (extra_work={extra})" if extra else ""))
        commit = git(repo, "rev-parse", "HEAD")
        report = os.path.join(repo, f"session-{i}.json")
        env = {**os.environ, "DISTPERF_BENCH_EXTRA_WORK": str(extra)}
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "pytest", "test_bench.py", "-q", "-p", "no:cacheprovider",
                               "--distperf", f"--distperf-device={args.device}", f"--distperf-json={report}"],
                              cwd=repo, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"session {i} failed (exit {done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        with open(report, encoding="utf-8") as f:
            doc = json.load(f)
        recorded = record_session(db, doc)
        runs = doc["tests"][0]["jobs"][0]["runs"]
        value = statistics.median(statistics.median(r["step_times"]) for r in runs)
        print(f"{i:>7}  {commit[:12]:<12}  {extra:>10g}  {value * 1e3:>23.1f} ms  "
              f"{time.monotonic() - start:.0f} s ({recorded.rows} rows)", flush=True)


def replay_sessions(args: argparse.Namespace, db: str) -> None:
    from pytest_distperf.store.history import record_session

    with open(args.replay, encoding="utf-8") as f:
        base = json.load(f)
    rng, start = random.Random(args.seed), _dt.datetime(2026, 1, 1, tzinfo=_dt.timezone.utc)
    print(f"sessions replayed from {args.replay}, history {db}", flush=True)
    print(f"{'session':>7}  {'commit':<12}  {'scale':>6}", flush=True)
    for i in range(args.sessions):
        scale = (1 + args.step if i >= args.step_at else 1.0) * rng.gauss(1.0, args.noise)
        doc = copy.deepcopy(base)
        doc["created_at"] = (start + _dt.timedelta(hours=i)).isoformat()
        doc["environment"]["git_commit"] = hashlib.sha1(f"replayed session {i}".encode()).hexdigest()
        for test in doc["tests"]:
            for job in test.get("jobs") or []:
                for run in job["runs"]:
                    run["step_times"] = [t * scale for t in run["step_times"]]
        record_session(db, doc)
        print(f"{i:>7}  {doc['environment']['git_commit'][:12]:<12}  {scale:>6.3f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--step-at", type=int, default=12, help="first session with the extra work")
    parser.add_argument("--extra-work", type=float, default=1.0, help="Shape.extra_work from --step-at on")
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default=None, help="workload shape (default: the plugin's for the device)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="runs per session (run-level values)")
    parser.add_argument("--db", help="history URL or file (default: a new file in a temporary folder)")
    parser.add_argument("--analyse-only", action="store_true", help="only run the history command on --db")
    parser.add_argument("--json", metavar="PATH", help="also write the trends and change points as JSON")
    parser.add_argument("--replay", metavar="REPORT", help="replay this --distperf-json document (see above)")
    parser.add_argument("--step", type=float, default=0.15, help="--replay: relative step from --step-at on")
    parser.add_argument("--noise", type=float, default=0.02, help="--replay: sd of each session's scale")
    parser.add_argument("--seed", type=int, default=19, help="--replay: random seed")
    args = parser.parse_args()
    if not 0 <= args.step_at <= args.sessions:  # 0 or --sessions: sessions appended to a history on one side
        parser.error("--step-at must lie between 0 and --sessions")
    db = args.db or os.path.join(tempfile.mkdtemp(prefix="distperf-history-"), "history.db")
    if args.replay:
        replay_sessions(args, db)
    elif not args.analyse_only:
        run_sessions(args, db)
    command = [sys.executable, "-m", "pytest_distperf", "history", db, "--points",
               *(["--metric", "step_time"] if args.replay else []), *(["--json", args.json] if args.json else [])]
    print("\n$ python -m pytest_distperf history " + " ".join(command[4:]), flush=True)
    return subprocess.run(command).returncode


if __name__ == "__main__":
    sys.exit(main())
