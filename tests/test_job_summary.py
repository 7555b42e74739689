"""The GitHub job summary ($GITHUB_STEP_SUMMARY, report/files.py): head vs base named as the other reports name
it, and a session without a distperf test said, not left out. Built from records; no job runs."""

from __future__ import annotations

from dataclasses import replace

from pytest_distperf.decide.policy import Policy
from pytest_distperf.decide.regression import GateContext
from pytest_distperf.decide.verdicts import MetricVerdict
from pytest_distperf.report.document import TestDocument
from pytest_distperf.report.files import markdown_summary, write_session_reports

LABEL = "head 03dfeb6b1234 vs base e5bebb815678 (merge base of main and HEAD)"


def _verdict(reference: str = "") -> MetricVerdict:
    v = MetricVerdict(test="t.py::test_x", job="ddp x2 cpu", metric="step_time", metric_kind="time", unit="s",
                      direction="lower", status="pass", baseline=0.1, current=0.101, current_runs=3, baseline_runs=3,
                      delta=0.01, low=-0.01, high=0.03, level=0.98, threshold=0.05)
    return replace(v.landed(Policy()), reference=reference, head_commit="03dfeb6b1234" if reference else None,
                   base_commit="e5bebb815678" if reference else None)


def test_head_vs_base_in_the_job_summary_names_both_commits_and_the_sides():
    context = GateContext(machine_class="cpu-x-ws2", machine={}, environment={},
                          against={"label": LABEL, "head_commit": "03dfeb6b1234", "base_commit": "e5bebb815678"})
    doc = TestDocument.from_records("t.py::test_x", "passed", 1.0, [_verdict(LABEL)], context)
    summary = markdown_summary([doc])
    assert f"· {LABEL}" in summary.splitlines()[2]  # the counts line names both commits
    assert f"**{LABEL}**" in summary
    assert "| test | job | metric | base | head | Δ | 98% interval | status |" in summary
    assert "| baseline | current |" not in summary
    # against stored baselines: as before, no commit named
    stored = markdown_summary([TestDocument.from_records("t.py::test_x", "passed", 1.0, [_verdict()])])
    assert "| test | job | metric | baseline | current | Δ | 98% interval | status |" in stored and " vs base " not in stored


def test_a_session_without_a_distperf_test_still_writes_the_job_summary(tmp_path):
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    written = write_session_reports([], str(tmp_path), None, None, str(summary), {"baselines": str(tmp_path / "b")},
                                    enabled=True)
    assert written == [f"job summary to {summary}"]
    assert summary.read_text() == "earlier step\n## distperf\n\n**no distperf test ran** (0 tests)\n"
    # without --distperf nothing is appended
    assert write_session_reports([], str(tmp_path), None, None, str(summary), {"baselines": "b"}, enabled=False) == []
    assert summary.read_text().count("## distperf") == 1
