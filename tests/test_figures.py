"""One number per quantity: a job's step time (figures/quantities.py) is the same figure in the terminal tables, the
JSON report, JUnit, the Markdown summary and the pytest-benchmark export -- one real comparison of 2-rank CPU jobs."""

from __future__ import annotations

import json
import math
import re
import statistics
import xml.etree.ElementTree as ET

import pytest

from pytest_distperf.figures.units import fmt_seconds

PERF_TEST = """
import pytest

@pytest.mark.distperf(world_size=2, repeats=2, max_repeats=2)
def test_cmp(distperf):
    cmp = distperf.compare(distperf.job("ddp", steps=3, warmup=1), distperf.job("fsdp2", steps=3, warmup=1))
    cmp.assert_step_time_within(10.0)
"""


def test_every_report_carries_the_same_step_time_for_each_job(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch):
    pytester.makepyfile(test_perf=PERF_TEST)
    summary = pytester.path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "--distperf-json", "report.json",
                                "--distperf-benchmark-json", "bench.json", "--junitxml", "junit.xml")
    result.assert_outcomes(passed=1)

    [test] = json.loads((pytester.path / "report.json").read_text())["tests"]
    assert "runs" not in test  # each job once, with its figures and its runs
    figures = {j["label"]: j["figures"]["step_time"] for j in test["jobs"]}
    assert set(figures) == {"ddp tiny x2 cpu", "fsdp2 tiny x2 cpu"}
    for job in test["jobs"]:  # the per-rank detail of the same runs: the same figure, and what it is
        assert job["figures"]["step_time"] == figures[job["label"]]
        medians = [statistics.median(r["step_times"]) for r in job["runs"]]  # each step: the slowest rank's
        assert figures[job["label"]] == pytest.approx(math.exp(statistics.fmean(math.log(m) for m in medians)))
    [check] = test["checks"]
    assert (check["a_value"], check["b_value"]) == (figures[check["a"]], figures[check["b"]])
    assert check["ratio"] == pytest.approx(figures[check["a"]] / figures[check["b"]])

    for label, value in figures.items():
        # the terminal's job table and check row
        result.stdout.fnmatch_lines([f"{label}*2x3*{fmt_seconds(value)}*"])
        result.stdout.re_match_lines([rf".*step_time .*{label} = {fmt_seconds(value)}.*"])
    # JUnit properties
    case = next(c for c in ET.parse(pytester.path / "junit.xml").iter("testcase") if c.get("name") == "test_cmp")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert {k[len("distperf.step_time["):-1]: float(v) for k, v in props.items()
            if k.startswith("distperf.step_time[")} == pytest.approx(figures, rel=1e-5)
    # the Markdown summary
    md = summary.read_text()
    for label, value in figures.items():
        assert f"| test_cmp | {label} | 2 | {fmt_seconds(value)} |" in md
    # the pytest-benchmark export (its stats are per step; the job's figure rides in extra_info)
    bench = json.loads((pytester.path / "bench.json").read_text())["benchmarks"]
    assert {b["params"]["job"]: b["extra_info"]["step_time"] for b in bench} == figures


MEMORY_TEST = """
import pytest

@pytest.mark.distperf(world_size=2, repeats=2, max_repeats=2)
def test_mem(distperf):
    fabric = distperf.job("lightning_fabric", options={"engine": "ddp"}, steps=3, warmup=1)
    ddp = distperf.job("ddp", steps=3, warmup=1)
    distperf.compare(fabric, ddp).assert_memory_within(1.01)
"""


@pytest.mark.slow
def test_a_cpu_memory_check_decides_on_the_training_state_and_shows_host_rss_beside_it(pytester: pytest.Pytester):
    """Lightning's own parity case: Fabric's DDP and torch's DDP train the same model alike and hold the same
    training state, while what each rank imports makes their host RSS growth differ. The CPU memory check decides
    on the training state, is named after it in every report, and carries the RSS figures as a secondary one."""
    from pytest_distperf.figures.units import fmt_bytes

    pytester.makepyfile(test_perf=MEMORY_TEST)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "--distperf-json", "report.json",
                                "--junitxml", "junit.xml")
    result.assert_outcomes(passed=1)
    [test] = json.loads((pytester.path / "report.json").read_text())["tests"]
    jobs = {j["label"]: j["figures"] for j in test["jobs"]}
    state = {label: f["work"]["train_memory"] for label, f in jobs.items()}
    rss = {label: f["peak_memory"] for label, f in jobs.items()}
    fabric, ddp = "lightning_fabric[engine=ddp] tiny x2 cpu", "ddp tiny x2 cpu"
    assert state[fabric] == state[ddp] > 0  # the same training state, to the byte
    [check] = test["checks"]
    assert check["name"] == "train_memory" and check["outcome"] == "pass" and check["ratio"] == 1.0
    assert (check["a_value"], check["b_value"]) == (state[fabric], state[ddp])
    assert check["secondary"] == (f"host RSS growth during training (peak_memory; shown, not decided on: it counts "
                                  f"imports and one-time allocations): A {fmt_bytes(rss[fabric])}, B "
                                  f"{fmt_bytes(rss[ddp])}, {rss[fabric] / rss[ddp]:.3f}x")
    # the terminal: the check row names the figure that decided, the RSS line under the table
    result.stdout.re_match_lines([rf"test_mem +train_memory +{re.escape(fabric)} = {fmt_bytes(state[fabric])} .*"
                                  rf"1\.000 \[1\.000, 1\.000\] .*✓ pass",
                                  rf"  test_mem train_memory: host RSS growth during training .*A "
                                  rf"{re.escape(fmt_bytes(rss[fabric]))}, B {re.escape(fmt_bytes(rss[ddp]))}.*"])
    # JUnit: the check under the figure's name; each job's training state beside its peak memory
    case = next(c for c in ET.parse(pytester.path / "junit.xml").iter("testcase") if c.get("name") == "test_mem")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["distperf.train_memory.outcome"] == "pass" and "distperf.peak_memory.outcome" not in props
    assert float(props[f"distperf.train_memory[{ddp}]"]) == pytest.approx(state[ddp])
    assert float(props[f"distperf.peak_memory[{ddp}]"]) == pytest.approx(rss[ddp])
