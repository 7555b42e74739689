"""Main-job stability: README's main job (`pytest --distperf -m zero3`) run N times, each from a fresh clone.

Each run clones the repository at HEAD into a new folder and runs the job there with that clone's package first
on the path (so every run starts as a new user's would: no baselines of its own, no cache), under a wall-clock
limit. It prints each run's exit status, wall time and every check's outcome with its interval, then whether the
exit status was the same every time (an inconclusive check may warn; it must never flip pass and fail).

    python benchmarks/main_job.py [--runs 10] [--within 600] [--json PATH] [--output DIR]
                                  [--fresh-vs-warm] [-- extra pytest args]

--output DIR: each run's whole terminal output goes to DIR/run-N.txt.
--fresh-vs-warm: alternate runs with `-o distperf_fresh_agent=true` (before the warm agent) and without it (after),
fresh first, so both modes see the same drift of a shared box; prints each mode's wall times and outcomes.

Each run also counts the ranks that died of a signal (the plugin's "died of SIGABRT"-style lines) and glibc's
heap-corruption messages in the output, so a crash rate per mode comes with the times.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_distperf.fs.jsonio import write_json_atomic  # noqa: E402

MAIN_JOB = ("-m", "pytest", "--distperf", "-m", "zero3", "-p", "no:cacheprovider")
# glibc's abort messages for a corrupted heap, and torch elastic's line for a rank ended by a signal.
HEAP_MESSAGES = ("malloc(): ", "free(): ", "double free or corruption", "corrupted size vs. prev_size")
SIGNAL_DEATH = re.compile(r"died of SIG[A-Z]+")


def one_run(index: int, within: float, extra: list[str], output: str | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"distperf-main-job-{index}-") as scratch:
        clone = os.path.join(scratch, "clone")
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", str(ROOT), clone], check=True)
        report = os.path.join(scratch, "report.json")
        env = {**os.environ, "PYTHONPATH": clone + os.pathsep + os.environ.get("PYTHONPATH", "")}
        env.pop("GITHUB_STEP_SUMMARY", None)
        started = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, *MAIN_JOB, f"--distperf-json={report}", *extra], cwd=clone,
                                  env=env, capture_output=True, text=True, timeout=within + 300)
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, text = None, e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else str(e.stdout or "")
        tail = text[-3000:]
        if output:
            os.makedirs(output, exist_ok=True)
            with open(os.path.join(output, f"run-{index}.txt"), "w") as f:
                f.write(text)
        wall = time.monotonic() - started
        checks, outcomes = [], Counter()
        if os.path.exists(report):
            with open(report) as f:
                doc = json.load(f)
            for test in doc["tests"]:
                outcomes[test["outcome"]] += 1
                for c in test.get("checks", []):
                    checks.append({"test": test["nodeid"].split("::")[-1], "check": c["name"],
                                   "outcome": c["outcome"], "ratio": c["ratio"], "low": c.get("low"),
                                   "high": c.get("high"), "pairs": c.get("pairs"), "limit": c["threshold"],
                                   "stopped": c.get("stopped", ""), "interval_text": c.get("interval_text")})
        # Runs by their stable id: a job shared between tests is one job, its runs counted once.
        jobs = len({r.get("id") for t in doc["tests"] for j in t.get("jobs", []) for r in j.get("runs", [])}
                   if os.path.exists(report) else ())
        return {"run": index, "rc": rc, "wall_s": round(wall, 1), "tests": dict(outcomes), "checks": checks,
                "jobs": jobs, "heap_messages": sum(text.count(m) for m in HEAP_MESSAGES),
                "signal_deaths": len({line.strip() for line in text.splitlines() if SIGNAL_DEATH.search(line)}),
                "summary": tail.strip().splitlines()[-1] if tail.strip() else ""}


def _interval(c: dict) -> str:
    if c.get("interval_text"):  # the report's own words (report/wording.bound_text), e.g. 'too few to bound'
        return f" {c['interval_text']}"
    if c["low"] is None and c["high"] is None:
        return ""
    lo = "0" if c["low"] is None else f"{c['low']:.3f}"
    hi = "inf" if c["high"] is None else f"{c['high']:.3f}"
    return f" [{lo}, {hi}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--within", type=float, default=600.0, help="seconds each run must end within")
    ap.add_argument("--json", help="write every run's record here (rewritten after each run)")
    ap.add_argument("--output", help="write each run's terminal output to OUTPUT/run-N.txt")
    ap.add_argument("--fresh-vs-warm", action="store_true",
                    help="alternate -o distperf_fresh_agent=true runs (odd) with warm-agent runs (even)")
    ap.add_argument("extra", nargs="*", help="more pytest arguments, after --")
    args = ap.parse_args()
    runs: list[dict] = []
    for i in range(1, args.runs + 1):
        mode = ("fresh" if i % 2 else "warm") if args.fresh_vs_warm else None
        extra = args.extra + (["-o", "distperf_fresh_agent=true"] if mode == "fresh" else [])
        r = one_run(i, args.within, extra, args.output)
        r["agent"] = mode
        runs.append(r)
        print(f"run {i}{f' ({mode} agent)' if mode else ''}: exit {r['rc']}, {r['wall_s']:.0f} s, tests {r['tests']},"
              f" {r['jobs']} launches, {r['signal_deaths']} rank(s) ended by a signal, {r['heap_messages']} heap message(s)"
              f"  ({r['summary']})", flush=True)
        for c in r["checks"]:
            print(f"    {c['test']} {c['check']}: {c['outcome']} {c['ratio']:.3f}{_interval(c)} vs {c['limit']:g}"
                  f" ({c['pairs']} pairs; {c['stopped'] or '-'})", flush=True)
        if args.json:
            write_json_atomic(args.json, {"command": "python " + " ".join(MAIN_JOB + tuple(args.extra)),
                                          "within_s": args.within, "fresh_vs_warm": args.fresh_vs_warm,
                                          "runs": runs})
    if args.fresh_vs_warm:
        for mode in ("fresh", "warm"):
            of = [r for r in runs if r["agent"] == mode]
            if of:
                w = [r["wall_s"] for r in of]
                print(f"{mode} agent: {len(of)} runs, wall median {statistics.median(w):.0f} s ({min(w):.0f}-{max(w):.0f}),"
                      f" exit statuses {dict(Counter(r['rc'] for r in of))}, {sum(r['jobs'] for r in of)} launches,"
                      f" {sum(r['signal_deaths'] for r in of)} rank(s) ended by a signal,"
                      f" {sum(r['heap_messages'] for r in of)} heap message(s)")
    statuses = Counter(r["rc"] for r in runs)
    walls = [r["wall_s"] for r in runs]
    over = sum(1 for w in walls if w > args.within)
    print(f"\n{len(runs)} runs: exit statuses {dict(statuses)}; wall {min(walls):.0f}-{max(walls):.0f} s, "
          f"{over} over {args.within:g} s; same exit status every time: {'yes' if len(statuses) == 1 else 'NO'}")
    return 0 if len(statuses) == 1 and over == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
