"""Where a baseline save's minutes go: a save of two jobs (DeepSpeed ZeRO-3 and FSDP2 on the built-in GPT, or on
a workload factory such as examples/my_model.py, N runs each) through the plugin, once with fresh agents (`-o distperf_fresh_agent=true`, before the warm agent)
and once with the warm agent, each in its own pytest process and its own baselines folder.

Per mode it prints the pytest process's wall time, the runs' wall time split into start-up (launch to the engine
build), build, warm-up, timed steps and other (the JSON report's `figures.time_split`, the one derivation:
figures/quantities.run_time_split), and the timed steps' share of the session.

    python benchmarks/save_share.py [--runs 6] [--world-size 1] [--modes fresh,warm] [--within 280] [--workload my_model:make_workload]
                                   [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_distperf.figures.quantities import TIME_PARTS  # noqa: E402
from pytest_distperf.fs.jsonio import write_json_atomic  # noqa: E402

TEST_FILE = '''
import pytest

# max_repeats: a save with no baseline yet runs exactly the repeats asked for, no extension
pytestmark = pytest.mark.distperf(world_size={world_size}, repeats={runs}, max_repeats={runs})
WORKLOAD = {workload!r}  # None: the built-in GPT at the device's default shape


def test_save_zero3_and_fsdp2(distperf):
    distperf.measure(distperf.job("deepspeed", options={{"stage": 3}}, workload=WORKLOAD))
    distperf.measure(distperf.job("fsdp2", workload=WORKLOAD))
'''


def one_save(mode: str, runs: int, world_size: int, within: float, workload: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"distperf-save-share-{mode}-") as scratch:
        shutil.copy(ROOT / "examples" / "my_model.py", scratch)
        Path(scratch, "test_save_share.py").write_text(TEST_FILE.format(world_size=world_size, runs=runs, workload=workload))
        report = os.path.join(scratch, "report.json")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), scratch, os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "pytest", "test_save_share.py", "-p", "no:cacheprovider", "-q", "--distperf",
               "--distperf-save", f"--distperf-baselines={scratch}/baselines", f"--distperf-repeats={runs}",
               f"--distperf-json={report}", "--rootdir", scratch]
        if mode == "fresh":
            cmd += ["-o", "distperf_fresh_agent=true"]
        if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):  # entry points off (the GPU image): name the plugin
            cmd[3:3] = ["-p", "pytest_distperf.plugin"]
        started = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=within)
            rc, text = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as e:
            rc, text = None, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else ""
        session = time.monotonic() - started
        jobs = []
        if os.path.exists(report):
            with open(report) as f:
                doc = json.load(f)
            for test in doc["tests"]:
                for job in test.get("jobs", []):
                    split = (job.get("figures") or {}).get("time_split") or {}
                    jobs.append({"label": job["label"], "runs": len(job.get("runs", [])), "time_split": split})
        total = {k: math.fsum(j["time_split"].get(k, 0.0) for j in jobs) for k in ("wall", *TIME_PARTS)}
        return {"mode": mode, "rc": rc, "session_s": round(session, 1), "jobs": jobs,
                "runs_total": {k: round(v, 2) for k, v in total.items()},
                "timed_share_of_session": round(total["timed"] / session, 4) if session > 0 else None,
                "tail": text[-1500:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=6, help="runs per job (--distperf-repeats)")
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--modes", default="fresh,warm")
    ap.add_argument("--within", type=float, default=280.0, help="seconds each pytest process may take")
    ap.add_argument("--workload", default=None,
                    help="a workload factory 'module:function' (examples/my_model.py is importable as my_model); "
                         "default: the built-in GPT")
    ap.add_argument("--json")
    args = ap.parse_args()
    results = []
    for mode in args.modes.split(","):
        r = one_save(mode, args.runs, args.world_size, args.within, args.workload)
        results.append(r)
        t = r["runs_total"]
        print(f"{mode} agent: exit {r['rc']}, pytest {r['session_s']:.1f} s; runs' wall {t['wall']:.1f} s = "
              + ", ".join(f"{p} {t[p]:.1f} s" for p in TIME_PARTS)
              + f"; timed steps {100 * (r['timed_share_of_session'] or 0):.1f}% of the session", flush=True)
        for j in r["jobs"]:
            s = j["time_split"]
            print(f"    {j['label']}: {j['runs']} runs, " + ", ".join(f"{p} {s.get(p, 0):.1f} s" for p in TIME_PARTS),
                  flush=True)
        if r["rc"] != 0:
            print(r["tail"], flush=True)
        if args.json:
            write_json_atomic(args.json, {"runs_per_job": args.runs, "world_size": args.world_size, "modes": results})
    return 0 if all(r["rc"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
