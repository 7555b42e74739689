"""Bookkeeping of benchmarks/detection_power.py: a collection cut short by a time limit resumes where it stopped."""

from __future__ import annotations

import json

import pytest

from benchmarks import detection_power
from pytest_distperf.spec.job import JobSpec
from pytest_distperf.rank.results import RunResult

JOB_ARGS = ["--device", "cpu", "--strategy", "ddp", "--shape", "tiny", "--steps", "2", "--stored", "2", "--rounds",
            "2", "--repeats", "2", "--trials", "5", "--knobs", "0.1,0.2", "--sizes", "0.05,0.10"]


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
    # the stored block, then rounds of ref, A/A, +5 %, +10 %, the order rotating by one each round
    assert fake_runs == [0.0, 0.0] + [0.0, 0.0, 0.1, 0.2] + [0.0, 0.1, 0.2, 0.0]
    data = json.loads(out.read_text())["data"]
    data["stored"].pop()  # as if cut short: one stored run and part of the last round missing
    del data["rounds"][1]["+10%"]
    (tmp_path / "cut.json").write_text(json.dumps({"data": data, "partial": True}))
    fake_runs.clear()
    detection_power.main([*JOB_ARGS, "--resume", str(tmp_path / "cut.json"), "--json", str(out)])
    assert fake_runs == [0.0, 0.2]
    final = json.loads(out.read_text())["data"]
    assert len(final["stored"]) == 2 and [sorted(r) for r in final["rounds"]] == [["+10%", "+5%", "A/A", "ref"]] * 2


def test_older_pool_files_are_re_analysed(tmp_path, capsys):
    steps = [[0.1, 0.1]] * 3
    old = {"data": {"job": {"device": "cpu", "world_size": 2, "strategy": "ddp", "shape": "tiny", "steps": 2,
                            "warmup": 3}, "slope": None, "baseline_pool": steps,
                    "conditions": [{"name": "A/A", "size": 0.0, "extra_work": 0.0},
                                   {"name": "+5%", "size": 0.05, "extra_work": 0.1}],
                    "pools": {"A/A": steps, "+5%": [[0.2, 0.2]] * 3}}}
    (tmp_path / "old.json").write_text(json.dumps(old))
    detection_power.main(["--from-json", str(tmp_path / "old.json"), "--trials", "5", "--floors", "0"])
    out = capsys.readouterr().out
    assert "paired +5%" in out and "gate   A/A" in out and "gate   +5%" in out


def test_resume_refuses_another_job(tmp_path, fake_runs):
    out = tmp_path / "dp.json"
    detection_power.main([*JOB_ARGS, "--json", str(out)])
    other = [a if a != "tiny" else "small" for a in JOB_ARGS]
    with pytest.raises(SystemExit, match="recorded for job"):
        detection_power.main([*other, "--resume", str(out)])


def test_work_figures_re_analyses_a_recording(capsys):
    """benchmarks/work_figures.py --from-json reads a recording and decides every figure it holds."""
    from pathlib import Path

    from benchmarks import work_figures

    recording = Path(__file__).resolve().parents[1] / "benchmarks/results/work-figures-1xh200-deepspeed.json"
    work_figures.main(["--from-json", str(recording), "--trials", "10"])
    out = capsys.readouterr().out
    assert "deepspeed, 8 stored runs, 3 rounds" in out
    assert all(f"\n{m} " in out for m in ("step_time", "gpu_time", "kernels_per_step", "flops_per_step"))
