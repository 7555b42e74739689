"""The HTML report and the PR comment as pure functions over a real session's JSON document
(tests/data/report_*: a CPU `-k 'trains_like or step_time_within_1_1x_fsdp2'` session of perf_tests/test_zero3.py,
its first two tests, and a probed test_comm.py session), and the compute/communication timeline the probe phase
records from a real torch.profiler trace."""

from __future__ import annotations

import copy
import datetime
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pytest_distperf.rank.probes.results import StepTimeline
from pytest_distperf.rank.probes.timeline import step_timeline
from pytest_distperf.rank.probes.trace import Trace, load
from pytest_distperf.report.charts import timeline_chart
from pytest_distperf.report.html import (SECTIONS, ChangePoint, TrendPoint, TrendSeries, render_history, render_html,
                                         write_html)
from pytest_distperf.report.outcomes import OUTCOME_STYLE
from pytest_distperf.report.pr_comment import HTML_URL_ENV, MARKER, MAX_LINES, render_pr_comment
from pytest_distperf.report.document import SessionDocument, unique_jobs
from pytest_distperf.decide.checks import Check
from pytest_distperf.decide.verdicts import MetricVerdict

DATA = Path(__file__).parent / "data"
SECTION_IDS = [sid for sid, _ in SECTIONS]


def trend_point(commit: str, value: float, day: int = 1) -> TrendPoint:
    """A session's point as the history store hands it in (store/history/trend.py)."""
    return TrendPoint(session_id=commit, created_at=datetime.datetime(2026, 1, day), git_commit=commit, host=None,
                      torch=None, deepspeed=None, config_hash=None, value=value, runs=(value,))


def change_point(points: list[TrendPoint], index: int, *environment_changes: str) -> ChangePoint:
    before, after = points[index - 1], points[index]
    return ChangePoint(index=index, before=before, after=after, before_mean=before.value, after_mean=after.value,
                       change=after.value / before.value - 1, pvalue=1e-4, tstat=9.0, direction="lower",
                       config_changed=False, environment_changes=environment_changes)


@pytest.fixture
def zero3_doc() -> dict:
    return json.loads((DATA / "report_zero3_cpu.json").read_text())


@pytest.fixture
def comm_doc() -> dict:
    return json.loads((DATA / "report_comm_cpu.json").read_text())


@pytest.fixture(autouse=True)
def _no_html_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(HTML_URL_ENV, raising=False)


def sections(page: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in re.finditer(r'<section id="([^"]+)">(.*?)</section>', page, re.S)}


def points(svg: str, side: str) -> int:
    """The marks of a strip chart's rows of one side ('pt-a' dots, 'pt-b' squares)."""
    groups = re.findall(rf'<g class="pts {side}"[^>]*>(.*?)</g>', svg)
    return sum(len(re.findall(r"<(?:circle|rect) ", g)) for g in groups)


def verdict_rows(page: str) -> list[dict[str, str]]:
    rows = []
    for m in re.finditer(r'<tr class="verdict-row"([^>]*)>', page):
        rows.append(dict(re.findall(r'data-([a-z]+)="([^"]*)"', m.group(1))))
    return rows


def test_every_section_renders_offline_from_a_real_document(zero3_doc: dict, tmp_path: Path):
    path = tmp_path / "report.html"
    write_html(str(path), zero3_doc)
    page = path.read_text(encoding="utf-8")
    assert list(sections(page)) == SECTION_IDS
    found = sections(page)
    assert found["comparisons"].count('class="chart strip runs"') == 1  # the step-time check; loss match has none
    assert found["comparisons"].count('class="chart ratio"') == 1
    assert 'class="chart strip ranks"' in found["jobs"] and 'class="chart bars memory"' in found["jobs"]
    assert zero3_doc["tests"][0]["machine_class"] in found["environment"]
    # Self-contained: no script, style, image or font from anywhere else (the SVG namespace is a name, not a fetch).
    assert not re.search(r'(src|href)="(https?:)?//', page)
    assert "<link" not in page and "@import" not in page and "url(http" not in page
    assert path.stat().st_size < 1 << 20
    assert not list(tmp_path.glob(".*.tmp"))  # written whole (temp file renamed), nothing left behind


def test_each_run_of_a_comparison_is_drawn_step_by_step(zero3_doc: dict):
    test = next(t for t in zero3_doc["tests"] if t["nodeid"].endswith("step_time_within_1_1x_fsdp2"))
    [check] = [c for c in test["checks"] if c["name"] == "step_time"]
    jobs = {j["label"]: j for j in test["jobs"]}
    steps = sum(len(r["step_times"]) for side in (check["a"], check["b"]) for r in jobs[side]["runs"])
    page = render_html({**zero3_doc, "tests": [test]})
    strip = re.search(r'<svg class="chart strip runs".*?</svg>', page, re.S).group(0)
    assert points(strip, "pt-a") + points(strip, "pt-b") == steps
    ratio = re.search(r'<svg class="chart ratio".*?</svg>', page, re.S).group(0)
    assert 'class="limit"' in ratio and 'class="estimate"' in ratio and 'class="ci"' in ratio
    assert f"A/B {check['ratio']:.3g}×" in ratio


def test_verdict_rows_match_the_document(zero3_doc: dict):
    rows = verdict_rows(render_html(zero3_doc))
    checks = [(t["nodeid"], c) for t in zero3_doc["tests"] for c in t["checks"]]
    ratio_rows = [r for r in rows if r["kind"] == "ratio"]
    assert len(ratio_rows) == len(checks)
    for nodeid, c in checks:
        [row] = [r for r in ratio_rows if nodeid in r["tests"].split("\n") and r["subject"].startswith(c["name"])]
        assert row["outcome"] == c["outcome"]
    # a verdict that several tests share (their cached comparison's runs) is one row naming every test
    baseline = [r for r in rows if r["kind"] == "baseline"]
    total = sum(len(t["verdicts"]) for t in zero3_doc["tests"])
    assert sum(len(r["tests"].split("\n")) for r in baseline) == total
    assert {r["outcome"] for r in baseline} == {"new"}


def test_an_xfail_and_the_outcomes_still_read_without_colour(zero3_doc: dict):
    doc = copy.deepcopy(zero3_doc)
    test = next(t for t in doc["tests"] if t["nodeid"].endswith("step_time_within_1_1x_fsdp2"))
    test["outcome"], test["xfail_reason"] = "skipped", "known upstream gap on cpu: ..."
    for c in test["checks"]:
        c["outcome"] = "fail"
    page = render_html(doc)
    rows = [r for r in verdict_rows(page) if test["nodeid"] in r["tests"].split("\n") and r["kind"] == "ratio"]
    assert rows and {r["outcome"] for r in rows} == {"xfail"}
    # every outcome a reader must tell apart has its own symbol and its own CSS class (border and pattern)
    shown = ("pass", "fail", "inconclusive", "xfail", "improved", "new")
    styles = [OUTCOME_STYLE[o] for o in shown]
    assert len({sym for _, sym in styles}) == len(shown) and len({cls for cls, _ in styles}) == len(shown)


def test_newer_outcome_fields_are_drawn_as_the_document_says(zero3_doc: dict):
    doc = copy.deepcopy(zero3_doc)
    test = next(t for t in doc["tests"] if t["nodeid"].endswith("step_time_within_1_1x_fsdp2"))
    check = next(c for c in test["checks"] if c["name"] == "step_time")
    # the decision core's three outcomes, an interval's level and an unbounded end, with the texts the gate writes
    check.update(outcome="inconclusive", level=0.98, method="paired", pairs=5, low=0.9, high=None)
    check["interval_text"] = Check.from_json(check).interval_text()
    verdict = test["verdicts"][0]
    verdict.update(status="inconclusive", level=0.95, low=-0.02, high=None, delta=0.04)
    verdict["interval_text"] = MetricVerdict.from_json(verdict).interval_text()
    page = render_html(doc)
    rows = [r for r in verdict_rows(page) if r["outcome"] == "inconclusive"]
    assert len(rows) == 2
    # an unbounded end reads in words, as in every report (report/wording.bound_text); the chart keeps the bounded end
    assert "5 pairs at" in check["interval_text"] and "too few to bound" in verdict["interval_text"]
    assert check["interval_text"] in page and verdict["interval_text"] in page
    ratio = re.search(r'<svg class="chart ratio".*?</svg>', page, re.S).group(0)
    assert "98% interval [0.9×, unbounded]" in ratio and 'class="ci-open"' in ratio


def test_each_probed_job_with_its_collectives_and_recorded_timelines(comm_doc: dict):
    probes = sections(render_html(comm_doc))["probes"]  # its traces were in a job folder that is gone: not read
    assert probes.count('class="chart bars collectives"') == 2
    assert probes.count('class="chart timeline"') == 2  # from the probe records' timelines, one lane set per rank
    records = [p for p in comm_doc["tests"][0]["probes"]]
    assert all({t["rank"] for t in p["timelines"]} == {0, 1} for p in records)
    assert all(trace in probes for p in records for trace in p["traces"])  # each trace named, for Perfetto
    assert "20" in probes  # ZeRO-3's all-gathers per step on the CPU job


TRACE_SCRIPT = textwrap.dedent("""
    import dataclasses, json, sys, torch, torch.distributed as dist
    from pytest_distperf.rank.probes import Recorder
    dist.init_process_group("gloo", init_method="file://" + sys.argv[3], rank=0, world_size=1)
    w = torch.randn(256, 256)
    with Recorder(("comms",), device="cpu", trace_path=sys.argv[1]) as recorder:
        for _ in range(3):
            with recorder.step():
                x = torch.randn(64, 256) @ w
                dist.all_reduce(x)
                (x @ w).sum()
    with open(sys.argv[2], "w") as f:
        json.dump(dataclasses.asdict(recorder.result().timeline), f)
    dist.destroy_process_group()
""")


@pytest.fixture(scope="module")
def cpu_probe(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """A real probe phase of three steps with a gloo all-reduce between two matmuls: its torch.profiler trace and
    the step timeline the Recorder computed from it."""
    folder = tmp_path_factory.mktemp("trace")
    path, timeline = folder / "probe-trace-rank0.json", folder / "timeline.json"
    subprocess.run([sys.executable, "-c", TRACE_SCRIPT, str(path), str(timeline), str(folder / "store")], check=True,
                   timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    return str(path), json.loads(timeline.read_text())


def test_one_steps_timeline_from_a_real_probe_phase(cpu_probe: tuple[str, dict], comm_doc: dict):
    trace, recorded = cpu_probe
    timeline = StepTimeline.from_dict(recorded)
    assert timeline == step_timeline(Trace(load(trace)), 0)  # the probe phase's record is the trace's middle step
    assert timeline.source == "CPU ops" and timeline.steps == 3 and timeline.step == 1 and timeline.rank == 0
    assert timeline.compute and timeline.comm
    assert all(0 <= s <= e <= timeline.length for s, e in timeline.compute)
    assert any("all_reduce" in name or "allreduce" in name for _, _, name in timeline.comm)

    doc = copy.deepcopy(comm_doc)
    probe = doc["tests"][0]["probes"][0]
    probe["timelines"] = [recorded]
    chart = re.search(r'<svg class="chart timeline".*?</svg>', sections(render_html(doc))["probes"], re.S).group(0)
    assert 'class="seg-compute"' in chart and 'class="seg-comm"' in chart


def test_baseline_runs_against_the_current_ones(zero3_doc: dict):
    doc = copy.deepcopy(zero3_doc)
    test = doc["tests"][0]
    job = test["jobs"][0]
    base_steps = [[t * 0.9 for t in r["step_times"]] for r in job["runs"]]
    [v] = [v for v in test["verdicts"] if v["job"] == job["label"] and v["metric"] == "step_time"]
    # the stored runs the verdict was decided against travel with it (the report never reads the baseline file)
    v.update(baseline_values=[sorted(s)[len(s) // 2] for s in base_steps], baseline_samples=base_steps)
    v.update(status="inconclusive", baseline=v["current"] * 0.9, delta=0.11, low=0.02, high=0.2, threshold=0.15,
             threshold_text="max(5%, 3 x 5.0% run-to-run) = 15.0%")
    trend = [trend_point(f"{i:040x}", 0.1 + 0.01 * (i >= 3)) for i in range(6)]
    history = [TrendSeries("cpu", test["nodeid"], job["label"], "step_time", "s", trend, [change_point(trend, 3)])]
    page = sections(render_html(doc, history=history))["baselines"]
    strip = re.search(r'<svg class="chart strip baseline".*?</svg>', page, re.S).group(0)
    assert points(strip, "pt-b") == sum(map(len, base_steps))  # the baseline's own step times
    assert points(strip, "pt-a") == sum(len(r["step_times"]) for r in job["runs"])
    assert 'class="chart delta"' in page and 'class="band"' in page  # the change, its interval, ± threshold
    assert 'class="chart trend"' in page and 'class="change-point"' in page


def test_history_page_marks_each_change_point_with_its_commits():
    points = [trend_point(f"c{i:02d}" + "0" * 38, 0.1 * (1.2 if i >= 12 else 1.0), i + 1) for i in range(24)]
    series = TrendSeries("cpu-x", "perf_tests/test_zero3.py::test_a", "fsdp2 tiny x2 cpu", "step_time", "s", points,
                         [change_point(points, 12)])
    page = render_history([series])
    assert page.count('class="trend-pt"') == 24 and page.count('class="change-point"') == 1
    assert "c110000..c120000 +20.0%" in page
    assert list(sections(page)) == ["trends"]


def test_pr_comment_within_25_lines_with_link_noise_runs_and_machine(zero3_doc: dict,
                                                                    monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(HTML_URL_ENV, "https://example.invalid/runs/1")
    doc = copy.deepcopy(zero3_doc)
    for test in doc["tests"]:  # the recorded step-time check stayed undecided on this box: here it passed
        for check in test["checks"]:
            check["outcome"] = "pass"
    text = render_pr_comment(doc)
    lines = text.splitlines()
    assert len(lines) <= MAX_LINES and lines[0] == MARKER
    assert "(https://example.invalid/runs/1)" in text
    assert "**Runs**" in text and "**Noise**" in text and f"`{doc['tests'][0]['machine_class']}`" in text
    assert "No failing, inconclusive or improved metric." in text  # both checks passed
    assert "(https://example.invalid/other)" in render_pr_comment(doc, html_url="https://example.invalid/other")


def test_pr_comment_lists_every_failing_metric_even_past_25_lines(zero3_doc: dict):
    doc = copy.deepcopy(zero3_doc)
    test = doc["tests"][1]
    template = next(c for c in test["checks"] if c["name"] == "step_time")
    test["checks"] = [{**template, "name": f"step_time_{i}", "outcome": "fail", "ratio": 1.5 + i / 100}
                      for i in range(40)]
    text = render_pr_comment(doc, html_path="out/report.html")
    assert all(f"step_time_{i}:" in text for i in range(40))
    assert "never cut" in text and len(text.splitlines()) > MAX_LINES
    lines = text.splitlines()
    table_end = max(i for i, line in enumerate(lines) if line.startswith("|"))
    assert lines[table_end + 1] == ""  # a paragraph right under a table would join it (GitHub's Markdown)
    assert "**Machine class**" in text and "`report.html`" in text  # the rest is still there


def test_a_verdict_that_fails_the_test_is_listed_whatever_its_status(zero3_doc: dict):
    doc = copy.deepcopy(zero3_doc)
    verdict = doc["tests"][0]["verdicts"][0]
    verdict["fails"] = True  # 'new' under --distperf-require-baseline
    text = render_pr_comment(doc)
    assert "✗ failing" in text and f"✗ new, fails | `{doc['tests'][0]['nodeid'].split('::')[-1]}`" in text
    page = sections(render_html(doc))["verdicts"]
    assert "new, fails the test" in page.split("<details")[0]  # in the open table, not the collapsed one


def test_gpu_timeline_lanes_from_kernels(tmp_path: Path):
    """The CUDA form (no GPU here): a hand-written trace in Kineto's layout, three steps, each with a GEMM kernel
    and an NCCL all-gather launched in it; in the middle step the all-gather runs half under the GEMM."""
    events = []
    for step in range(3):
        t0 = 1000.0 * step
        events.append({"ph": "X", "cat": "user_annotation", "name": "distperf:step", "ts": t0, "dur": 900.0,
                       "pid": 1, "tid": 7})
        for corr, name, start, dur in ((10 * step + 1, "sm90_xmma_gemm_bf16", 100.0, 400.0),
                                       (10 * step + 2, "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", 300.0, 400.0)):
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": t0 + 5.0 * (corr % 10),
                           "dur": 5.0, "pid": 1, "tid": 7, "args": {"correlation": corr}})
            events.append({"ph": "X", "cat": "kernel", "name": name, "ts": t0 + start, "dur": dur, "pid": 0,
                           "tid": 7 if "gemm" in name else 20, "args": {"correlation": corr, "stream": 7}})
    path = tmp_path / "probe-trace-rank0.json"
    path.write_text(json.dumps({"traceEvents": events}))
    timeline = step_timeline(Trace(load(str(path))), 0)
    assert timeline.source == "GPU kernels" and timeline.step == 1
    assert timeline.compute == [(100.0, 500.0)]
    assert timeline.comm == [(300.0, 700.0, "ncclDevKernel_AllGather_RING_LL")]
    chart = timeline_chart([timeline], "one step")
    assert chart.count('class="seg-overlap"') == 1  # 300..500: the all-gather under the GEMM


def test_a_comparison_that_grew_is_one_job_with_all_its_runs(zero3_doc: dict):
    """Tests sharing a comparison record its runs when each ends; a later test may have seen more pairs."""
    doc = copy.deepcopy(zero3_doc)
    first, second = doc["tests"]
    for job in first["jobs"]:
        job["runs"] = job["runs"][:-1]  # the first test ended before the last pair ran
    jobs = unique_jobs(SessionDocument.from_json(doc).tests)
    assert len(jobs) == len(second["jobs"])
    runs = {j["label"]: len(j["runs"]) for j in second["jobs"]}
    assert all(len(v.job.runs) == runs[v.job.label] and v.tests == [first["nodeid"], second["nodeid"]]
               for v in jobs)


def test_the_trend_of_a_metric_without_a_baseline(zero3_doc: dict):
    test = zero3_doc["tests"][0]
    verdict = test["verdicts"][0]  # 'new': no baseline on this machine class yet, but a history of sessions
    series = TrendSeries("cpu", test["nodeid"], verdict["job"], verdict["metric"], verdict["unit"],
                         [trend_point(f"{i:040x}", 1.0 + i) for i in range(3)])
    page = sections(render_html(zero3_doc, history=[series]))["baselines"]
    assert page.count('class="chart trend"') == 1 and 'class="chart strip baseline"' not in page


def test_every_text_from_the_document_is_escaped(zero3_doc: dict, comm_doc: dict):
    """Labels, node ids, notes, messages and environment values come from user code and the machine: markup in
    any of them reads as text on the page, never as an element or attribute."""
    evil = '<img src=x onerror=alert(1)>"\'<script>alert(2)</script>'
    doc = copy.deepcopy(zero3_doc)
    doc["environment"]["host"] = evil
    doc["invocation"]["args"] = [evil]
    doc["tests"].append({**copy.deepcopy(doc["tests"][0]), "nodeid": f"t.py::test_{evil}", "outcome": "failed",
                         "message": evil, "failure": evil, "machine_class": evil, "checks": [], "verdicts": []})
    for test in doc["tests"]:
        for job in test["jobs"]:
            job["label"] = f"job {evil}"
        for v in test["verdicts"]:
            v.update(job=f"job {evil}", note=evil, threshold_text=evil)
        for c in test["checks"]:
            c.update(a=f"job {evil}", b=f"job {evil}", name=f"step_time {evil}")
    probe = copy.deepcopy(comm_doc["tests"][0]["probes"][0])
    probe.update(label=evil, traces=[evil], not_measured={evil: evil})
    probe["timelines"][0]["comm"][0][2] = evil
    doc["tests"][0]["probes"] = [probe]
    trend = [trend_point(evil, 1.0 + i) for i in range(3)]
    history = [TrendSeries(evil, doc["tests"][0]["nodeid"], f"job {evil}", "step_time", "s", trend,
                           [change_point(trend, 1, evil)])]
    for page in (render_html(doc, history=history), render_history(history)):
        assert "<img" not in page and "<script>alert" not in page and "onerror=alert(1)>" not in page
        assert page.count("<script>") == 1  # the page's own
        assert "&lt;img src=x onerror=alert(1)&gt;" in page


def test_a_test_that_ended_before_its_first_job(zero3_doc: dict):
    """A test that errors at setup (e.g. on a corrupt baseline file) has no jobs, machine or environment."""
    doc = {**zero3_doc, "tests": [{"nodeid": "t.py::test_x", "outcome": "error", "duration": 0.1,
                                   "message": "E   distperf: corrupt baseline", "failure": "corrupt baseline",
                                   "runs": [], "checks": [], "verdicts": [], "probes": [], "baseline_saved": []}]}
    page = sections(render_html(doc))
    [row] = verdict_rows(page["verdicts"])
    assert row["kind"] == "test" and row["outcome"] == "error" and "corrupt baseline" in page["verdicts"]
    assert "per-rank detail in this document" in page["jobs"]
    assert "test outcome: corrupt baseline" in render_pr_comment(doc)
