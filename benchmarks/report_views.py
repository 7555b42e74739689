"""One step-time figure in every output: a session's reports are views of one session document (issue #31).

Runs a small session twice through the plugin -- a baseline save, then a compare against it -- with every report
asked for (terminal, --distperf-json, JUnit XML, the Markdown job summary, the pytest-benchmark export,
--distperf-html, --distperf-pr-comment). The test measures two jobs, fsdp2 and ddp, and checks fsdp2's step time
against ddp's. For each job it prints the step time each output shows: the JSON report's job (`tests[].jobs[]`,
written once: its figures and the median of each run's figures), the JUnit property, the benchmark export's
`extra_info.step_time`, the baseline verdict's `current`, and the terminal, Markdown and HTML texts. They must all
be the same figure (to each output's rounding); the script exits 1 where one differs.

    python benchmarks/report_views.py                       # CPU, 2 gloo ranks
    python benchmarks/report_views.py --device cuda --world-size 1
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
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pytest_distperf.figures.units import fmt_seconds  # noqa: E402

JOB = "JSON tests[].jobs[].figures (JobRecord)"

TEST_FILE = '''
import pytest

pytestmark = pytest.mark.distperf(world_size={world_size}, repeats={runs}, max_repeats={runs})


def test_views(distperf):
    fsdp2, ddp = distperf.job("fsdp2"), distperf.job("ddp")
    distperf.compare(fsdp2, ddp).assert_step_time_within(100.0)  # a check that passes: it is the records we read
'''


def session(scratch: str, args: argparse.Namespace, save: bool) -> tuple[int, float, str]:
    out = os.path.join(scratch, "save" if save else "compare")
    os.makedirs(out, exist_ok=True)
    cmd = [sys.executable, "-m", "pytest", "test_views.py", "-p", "no:cacheprovider", "-q", "--distperf",
           f"--distperf-device={args.device}", f"--distperf-baselines={scratch}/baselines", "--rootdir", scratch,
           f"--distperf-json={out}/report.json", f"--junitxml={out}/junit.xml",
           f"--distperf-benchmark-json={out}/benchmark.json", f"--distperf-html={out}/report.html",
           f"--distperf-pr-comment={out}/comment.md"] + (["--distperf-save"] if save else [])
    env = {**os.environ, "GITHUB_STEP_SUMMARY": f"{out}/summary.md"}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True)
    Path(out, "terminal.txt").write_text(proc.stdout + proc.stderr)
    return proc.returncode, time.monotonic() - t0, out


def views(out: str) -> dict[str, dict[str, object]]:
    """Per job label: the step time as each output shows it."""
    doc = json.loads(Path(out, "report.json").read_text())
    [test] = doc["tests"]
    found: dict[str, dict[str, object]] = {}
    assert "runs" not in test, "a job is written once, under tests[].jobs[]"
    for j in test["jobs"]:
        found.setdefault(j["label"], {})[JOB] = j["figures"]["step_time"]
        run_times = [r["figures"]["step_time"] for r in j["runs"]]  # the job's: their geometric mean
        found[j["label"]]["JSON tests[].jobs[].runs[].figures (geometric mean)"] = (
            statistics.geometric_mean(run_times))
    for v in test["verdicts"]:
        if v["metric"] == "step_time" and v["current"] is not None:
            found.setdefault(v["job"], {})["JSON verdict current (MetricVerdict)"] = v["current"]
    for p in ET.parse(Path(out, "junit.xml")).iter("property"):
        m = re.fullmatch(r"distperf\.step_time\[(.+)\]", p.get("name", ""))
        if m:
            found.setdefault(m.group(1), {})["JUnit property"] = float(p.get("value", "nan"))
    for b in json.loads(Path(out, "benchmark.json").read_text())["benchmarks"]:
        found.setdefault(b["params"]["job"], {})["benchmark export extra_info"] = b["extra_info"]["step_time"]
    texts = {"terminal": Path(out, "terminal.txt").read_text(), "Markdown summary": Path(out, "summary.md").read_text(),
             "HTML report": Path(out, "report.html").read_text()}
    for label, shown in found.items():
        figure = float(shown[JOB])  # type: ignore[arg-type]
        for name, text in texts.items():
            shown[f"{name} text {fmt_seconds(figure)!r}"] = fmt_seconds(figure) in text
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--keep", help="copy both sessions' outputs into this folder")
    args = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory(prefix="distperf-report-views-") as scratch:
        Path(scratch, "test_views.py").write_text(TEST_FILE.format(world_size=args.world_size, runs=args.runs))
        for save in (True, False):
            rc, wall, out = session(scratch, args, save)
            print(f"{'save' if save else 'compare'}: exit {rc} in {wall:.1f} s")
            if rc != 0:
                print(Path(out, "terminal.txt").read_text()[-3000:])
                bad += 1
                continue
            for label, shown in views(out).items():
                numbers = {k: v for k, v in shown.items() if not isinstance(v, bool)}
                ref = numbers[JOB]
                print(f"  {label}:")
                for name, value in shown.items():
                    same = value if isinstance(value, bool) else abs(float(value) / float(ref) - 1) < 1e-5
                    bad += not same
                    print(f"    {'ok ' if same else 'DIFFERS'} {name}: {value}")
        if args.keep:
            subprocess.run(["cp", "-r", f"{scratch}/save", f"{scratch}/compare", args.keep], check=False)
    print("one figure in every output" if not bad else f"{bad} output(s) differ or failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
