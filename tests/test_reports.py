"""Reports CI reads: --distperf-json, the $GITHUB_STEP_SUMMARY Markdown, the pytest-benchmark export, JUnit
properties -- from real 2-rank CPU jobs compared against a baseline saved in the same folder."""

from __future__ import annotations

import json
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from pytest_distperf.decide.regression import GateContext
from pytest_distperf.launch import fingerprint
from records import job_record, documents_of

# Comparing adds runs up to the adaptive budget (--distperf-max-repeats): 2, as the test's repeats.
INNER_OPTS = ("--distperf", "-p", "no:cacheprovider", "--distperf-max-repeats", "2")
# test_ddp's job is the one tests/conftest.py saves once per session (saved_ddp_baseline): its steps and warmup
STEPS, WARMUP = 6, 2

PERF_TESTS = f"""
import pytest

@pytest.mark.distperf(world_size=2)
def test_ddp(distperf):
    distperf.measure("ddp", repeats=2, steps={STEPS}, warmup={WARMUP})

@pytest.mark.distperf(world_size=2)
def test_broken_baseline(distperf):
    distperf.measure("ddp", repeats=1, steps=2, warmup=1)
"""


@pytest.fixture(autouse=True)
def _no_job_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)


@pytest.mark.slow
def test_json_markdown_benchmark_and_junit_reports(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                  saved_ddp_baseline):
    pytester.makepyfile(test_perf=PERF_TESTS)
    # test_ddp's baseline: the session's real save of this job (tests/conftest.py), copied here as a save of 2 runs
    # (the test's repeats and budget) would have written it
    assert (saved_ddp_baseline.steps, saved_ddp_baseline.warmup) == (STEPS, WARMUP)
    saved_ddp_baseline.copy_to(pytester.path, "test_perf.py::test_ddp", runs=2)
    folder = pytester.path / "baselines" / fingerprint.machine_class("cpu", 2).name
    assert sorted(p.name for p in folder.glob("*.json")) == ["test_perf--test_ddp.json"]
    broken = folder / "test_perf--test_broken_baseline.json"
    broken.write_text('{"format_version": 1, "test": ')  # truncated: that test errors before running a job

    summary = pytester.path / "summary.md"
    summary.write_text("earlier step output\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = pytester.runpytest(*INNER_OPTS, "--distperf-json", "out/report.json", "--distperf-benchmark-json",
                                "out/bench.json", "--junitxml", "junit.xml")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*distperf: wrote JSON report out/report.json*",
                                 "*distperf: wrote pytest-benchmark JSON out/bench.json*"])

    # JSON: job configuration, environment, per-rank metrics, verdicts
    report = json.loads((pytester.path / "out" / "report.json").read_text())
    assert report["environment"]["torch"] and report["environment"]["host"]
    assert "--distperf-json" in report["invocation"]["args"]
    assert report["summary"]["outcomes"] == {"passed": 1, "error": 1}
    tests = {t["nodeid"]: t for t in report["tests"]}
    ok = tests["test_perf.py::test_ddp"]
    assert ok["outcome"] == "passed" and ok["machine_class"] == folder.name
    [job] = ok["jobs"]
    assert job["config"]["strategy"] == "ddp" and job["config"]["steps"] == STEPS and len(job["runs"]) == 2
    for i, run in enumerate(job["runs"]):
        assert [r["rank"] for r in run["ranks"]] == [0, 1]
        for r in run["ranks"]:
            assert len(r["step_times"]) == STEPS and r["host_peak_rss"] > 0 and r["optimizer_state_bytes"] > 0
            # the step breakdown in the job's first run of the session only (JobSpec.measure_once)
            expected = {"forward", "backward", "optimizer", "other", "total"} if i == 0 else set()
            assert set(r["step_breakdown"]) == expected
    verdicts = {v["metric"]: v for v in ok["verdicts"]}
    # a CPU job's memory is decided on the training state; host RSS growth rides on that verdict, never decided
    assert set(verdicts) >= {"step_time", "train_memory", "optimizer_state_bytes"} and "peak_memory" not in verdicts
    assert "host RSS growth" in verdicts["train_memory"]["secondary"]
    saved = json.loads((folder / "test_perf--test_ddp.json").read_text())["jobs"]["ddp tiny x2 cpu"]["metrics"]
    assert {"peak_memory", "train_memory"} <= set(saved)  # RSS is stored, never dropped
    result.stdout.fnmatch_lines(["*test_ddp*ddp tiny x2 cpu*train_memory*✓*",
                                 "  ddp tiny x2 cpu train_memory: host RSS growth during training (peak_memory; shown, "
                                 "not decided on: *): baseline *, current *"])
    assert verdicts["optimizer_state_bytes"]["status"] == "pass" and verdicts["step_time"]["baseline_runs"] == 2
    bad = tests["test_perf.py::test_broken_baseline"]
    assert bad["outcome"] == "error" and "truncated" in bad["message"] and str(broken) in bad["message"]

    # Markdown appended to $GITHUB_STEP_SUMMARY
    md = summary.read_text()
    assert md.startswith("earlier step output\n## distperf")
    assert "| test | job | metric | baseline | current | Δ | 98% interval | status |" in md
    assert "| test_ddp | ddp tiny x2 cpu | step_time |" in md
    # the failure's reason in the summary line, not only in the folded traceback (issue #30)
    [line] = [x for x in md.splitlines() if x.startswith("<details><summary>✗ test_perf.py::test_broken_baseline")]
    assert line.startswith("<details><summary>✗ test_perf.py::test_broken_baseline: ") and "truncated" in line

    # pytest-benchmark layout, readable by pytest-benchmark's own compare command
    bench = json.loads((pytester.path / "out" / "bench.json").read_text())
    assert set(bench) >= {"machine_info", "commit_info", "benchmarks", "datetime", "version"}
    [b] = bench["benchmarks"]
    assert b["name"] == "test_ddp[ddp tiny x2 cpu]" and b["stats"]["rounds"] == 2 * STEPS
    assert b["stats"]["ops"] == pytest.approx(1 / b["stats"]["mean"])
    assert b["stats"]["data"] == [t for run in job["runs"] for t in run["step_times"]]
    exe = shutil.which("pytest-benchmark")
    if exe is None:
        pytest.skip("pytest-benchmark is not installed: cannot check that it reads the export")
    out = subprocess.run([exe, "compare", "out/bench.json", "--columns", "min,median,ops,rounds"],
                         cwd=pytester.path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Failed to load" not in out.stdout + out.stderr
    assert "test_ddp[ddp tiny x2 cpu]" in out.stdout

    # JUnit: the verdict as properties of the test case
    case = next(c for c in ET.parse(pytester.path / "junit.xml").iter("testcase") if c.get("name") == "test_ddp")
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    # same code as the baseline: never "fail"; "improved" is possible on a noisy 2-core box (test_baselines.py)
    assert props["distperf.baseline.step_time[ddp tiny x2 cpu]"].split()[0] in ("pass", "inconclusive", "improved")
    assert props["distperf.baseline.optimizer_state_bytes[ddp tiny x2 cpu]"].startswith("pass +0.0%")


def test_report_paths_are_checked_before_running(pytester: pytest.Pytester):
    pytester.makepyfile(test_perf=PERF_TESTS)
    (pytester.path / "adir").mkdir()
    result = pytester.runpytest(*INNER_OPTS, "--distperf-json", "adir")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--distperf-json: *adir is a folder; give a file path*"])


def test_markdown_and_benchmark_export_read_records_only():
    from pytest_distperf.report.document import TestDocument
    from pytest_distperf.report.files import benchmark_json, markdown_summary

    verdict = {"kind": "baseline", "test": "t.py::test_a", "job": "j", "metric": "step_time", "metric_kind": "time",
               "unit": "s", "direction": "lower",
               "baseline": 0.1, "current": 0.12, "delta": 0.2, "low": 0.15, "high": 0.25, "level": 0.98,
               "status": "fail", "fails": True}
    run = {"step_times": [0.1, 0.3], "peak_memory": 5, "tokens_per_step": 10}
    job = job_record([run], id="job-run-1", label="j", runs=1, step_time=0.2, run_cv=None, peak_memory=5.0)
    entry = TestDocument.from_records("t.py::test_a", "failed", 1.0, [verdict, job],
                                      GateContext(machine_class="m", machine={}, environment={}), "boom")
    md = markdown_summary([entry])
    assert "| test_a | j | step_time | 100.0 ms | 120.0 ms | +20.0% | [+15.0%, +25.0%] | ✗ |" in md
    stats = benchmark_json([entry, entry], {"host": "h"})["benchmarks"]
    assert len(stats) == 1  # the same runs shared by two tests are exported once
    assert stats[0]["stats"]["median"] == pytest.approx(0.2) and stats[0]["extra_info"]["baseline_status"] == "fail"
    assert stats[0]["extra_info"]["step_time"] == 0.2  # the job's figure, as every other report shows it


def test_session_environment_without_entries_is_read_for_the_session_device(monkeypatch: pytest.MonkeyPatch):
    # A session interrupted before any test finished still reports its own environment, for its device:
    # on a GPU runner that means the CUDA, NCCL and driver versions, not the CPU fields.
    from pytest_distperf.report.document import TestDocument
    from pytest_distperf.report.files import session_environment

    asked: list[str] = []
    monkeypatch.setattr(fingerprint, "soft_metadata", lambda device, rootdir: asked.append(device) or {"d": device})
    assert session_environment([], "/root", "cuda") == {"d": "cuda"} and asked == ["cuda"]
    recorded = TestDocument.from_records("t.py::test_a", "passed", 1.0, [],
                                         GateContext(machine_class="m", machine={}, environment={"torch": "2.11"}))
    assert session_environment([recorded], "/root", "cuda") == {"torch": "2.11"} and asked == ["cuda"]


def test_check_tables_show_the_pair_to_pair_variation():
    from pytest_distperf.report import terminal
    from pytest_distperf.report.files import markdown_summary

    check = {"kind": "check", "name": "step_time", "a": "zero3", "b": "fsdp2", "a_value": 0.11, "b_value": 0.1,
             "ratio": 1.1, "low": 1.02, "high": 1.19, "threshold": 1.1, "outcome": "inconclusive", "unit": "s",
             "method": "paired", "pairs": 6, "pair_cv": 0.043}
    unpaired = {**check, "name": "peak_memory", "method": "unpaired", "pair_cv": None, "outcome": "pass"}
    lines = terminal.render(documents_of(("t.py::test_a", [check, unpaired])))
    header = next(line for line in lines if "pair-to-pair" in line)
    row = next(line for line in lines if "step_time" in line)
    assert row[header.index("pair-to-pair"):].split()[0] == "4.3%"
    md = markdown_summary(documents_of(("t.py::test_a", [check, unpaired])))
    assert "| pairs | pair-to-pair | limit |" in md and "| 6 | 4.3% | 1.1 |" in md and "| - | - | 1.1 |" in md


def test_a_job_shared_by_several_tests_is_one_row_in_the_job_table():
    from pytest_distperf.report import terminal

    run = job_record(id="job-1")  # a job is one job by its id (its first run's)
    grown = job_record(runs=5, id="job-1")  # the same job, extended for a later test: one row, its most runs
    other = job_record(runs=5, id="job-2")  # another job of the same configuration: its own row
    lines = terminal.render(documents_of(("t.py::test_a", [run]), ("t.py::test_b", [run]), ("t.py::test_c", [grown]),
                                         ("t.py::test_d", [other])))
    assert [line.split()[4] for line in lines if line.startswith("ddp tiny")] == ["5x10", "5x10"]


def test_a_workload_that_counts_no_tokens_shows_no_rate():
    from pytest_distperf.report import terminal

    run = job_record(label="fsdp2 my_model:make_workload x2 cpu", tokens_per_s=0.0)
    [row] = [line for line in terminal.render(documents_of(("t.py::test_a", [run]))) if line.startswith("fsdp2")]
    assert row.split()[13:16] == ["-", "1.00", "MiB"]  # tok/s, then peak memory
