"""Bookkeeping of benchmarks/detection_power.py: a collection cut short by a time limit resumes where it stopped."""

from __future__ import annotations

import json

import pytest

from benchmarks import detection_power
from pytest_distperf.spec import JobSpec
from pytest_distperf.results import RunResult

JOB_ARGS = ["--device", "cpu", "--strategy", "ddp", "--shape", "tiny", "--steps", "2", "--pool", "2",
            "--repeats", "1", "--trials", "5", "--knobs", "0.1,0.2", "--sizes", "0.05,0.10"]


@pytest.fixture
def fake_runs(monkeypatch):
    """Stands in for the launcher so the test checks which runs are made, not their timings."""
    made: list[float] = []

    def run_once(job: JobSpec, timeout: float) -> RunResult:
        made.append(job.shape_overrides.get("extra_work", 0.0))
        return RunResult(spec=job, ranks=[], wall_seconds=0.0)

    monkeypatch.setattr(detection_power, "run_once", run_once)
    monkeypatch.setattr(RunResult, "step_times", property(lambda self: [0.1, 0.1]))
    return made


def test_resume_fills_only_the_missing_runs(tmp_path, fake_runs):
    out = tmp_path / "dp.json"
    detection_power.main([*JOB_ARGS, "--json", str(out)])
    assert len(fake_runs) == 2 + 2 * 3  # baseline pool, then A/A, +5 %, +10 % round-robin
    data = json.loads(out.read_text())["data"]
    data["baseline_pool"].pop()  # as if cut short: one baseline run and half a round missing
    data["pools"]["+10%"].pop()
    (tmp_path / "cut.json").write_text(json.dumps({"data": data, "partial": True}))
    fake_runs.clear()
    detection_power.main([*JOB_ARGS, "--resume", str(tmp_path / "cut.json"), "--json", str(out)])
    assert fake_runs == [0.0, 0.2]
    final = json.loads(out.read_text())["data"]
    assert [len(p) for p in [final["baseline_pool"], *final["pools"].values()]] == [2, 2, 2, 2]


def test_resume_refuses_another_job(tmp_path, fake_runs):
    out = tmp_path / "dp.json"
    detection_power.main([*JOB_ARGS, "--json", str(out)])
    other = [a if a != "tiny" else "small" for a in JOB_ARGS]
    with pytest.raises(SystemExit, match="recorded for job"):
        detection_power.main([*other, "--resume", str(out)])
