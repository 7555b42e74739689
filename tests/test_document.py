"""The session document: each figure derived once (figures/quantities.run_figures), serialised once
(document.run_to_dict), and shared runs named by their ids, never matched by value."""

from __future__ import annotations

import json

import pytest

from pytest_distperf.fs.jsonio import FormatVersionError
from pytest_distperf.store.report_format import REPORT, run_to_dict
from pytest_distperf.figures.quantities import RunFigures, job_figures, job_id, node_step_medians, run_figures
from pytest_distperf.rank.results import RankResult, RunResult
from pytest_distperf.report.document import JobRecord, SessionDocument, TestDocument
from pytest_distperf.spec.job import JobSpec
from records import job_record, documents_of


def _run(steps: list[list[float]], memory: int = 1 << 20) -> RunResult:
    spec = JobSpec(world_size=len(steps), device="cpu", strategy="ddp")
    ranks = [RankResult(rank=r, step_times=list(s), losses=[1.0] * len(s), cuda_peak_allocated=None,
                        cuda_peak_reserved=None, host_peak_rss=memory + 100, host_rss_before_build=100,
                        optimizer_state_bytes=1200, num_params=100, tokens_per_step=512, build_seconds=0.0,
                        warmup_seconds=0.0) for r, s in enumerate(steps)]
    return RunResult(spec=spec, ranks=ranks, wall_seconds=1.0)


def test_every_run_has_its_own_stable_id_and_a_job_is_named_by_its_first_run():
    runs = [_run([[0.1, 0.2, 0.3], [0.2, 0.1, 0.1]]) for _ in range(3)]
    assert len({r.id for r in runs}) == 3
    assert runs[0] == _run([[0.1, 0.2, 0.3], [0.2, 0.1, 0.1]])  # the id is a name, not part of the value
    f = job_figures("ddp", runs)
    assert (f.id, f.run_ids) == (job_id(runs), tuple(r.id for r in runs))
    assert job_figures("ddp", runs[:2]).id == f.id  # the same job seen before its list grew


def test_a_run_is_serialised_with_the_figures_every_reader_takes():
    run = _run([[0.1, 0.2, 0.3], [0.2, 0.1, 0.4]])
    d = json.loads(json.dumps(run_to_dict(run)))
    assert d["id"] == run.id
    assert d["figures"]["step_time"] == 0.2  # the median of the steps, each the slowest rank's
    assert RunFigures.from_json(d["figures"]) == run_figures(run)
    job = json.loads(json.dumps(JobRecord.from_runs("ddp", [run]).to_json()))
    assert job["id"] == job["figures"]["id"] == job_id([run])
    assert job["figures"]["step_time"] == d["figures"]["step_time"] and job["runs"] == [d]  # the run once
    assert JobRecord.from_json(job) == JobRecord.from_runs("ddp", [run])



def test_a_run_of_several_nodes_carries_each_nodes_median_step_time():
    run = _run([[0.1, 0.2, 0.3], [0.2, 0.2, 0.2], [0.5, 0.6, 0.7], [0.4, 0.4, 0.4]])
    assert node_step_medians(run) == {}  # one node
    for k, (node, host) in zip(run.ranks, [(0, "gpu-01"), (0, "gpu-01"), (1, "gpu-07"), (1, "gpu-07")]):
        k.node_rank, k.host = node, host
    assert node_step_medians(run) == {"node 0 (gpu-01)": 0.2, "node 1 (gpu-07)": 0.45}
    assert json.loads(json.dumps(run_to_dict(run)))["node_step_medians"] == node_step_medians(run)

def test_a_report_of_a_newer_version_is_refused_naming_it():
    report = SessionDocument([], {}, {}).to_json()
    assert report["format_version"] == REPORT.version == 1
    with pytest.raises(FormatVersionError, match=rf"r.json: JSON report format version {REPORT.version + 1} is newer "
                                                 rf"than the version {REPORT.version}"):
        SessionDocument.from_json({**report, "format_version": REPORT.version + 1}, "r.json")


def test_a_shared_job_is_one_row_by_id_with_all_its_runs():
    from pytest_distperf.report import terminal

    run = job_record(id="job-run-1")
    grown = job_record(id="job-run-1", runs=5, step_time=0.11)  # the same runs, extended for a later test
    other = job_record(id="job-run-9")  # another job with equal figures: its own row
    lines = terminal.render(documents_of(("t.py::test_a", [run]), ("t.py::test_b", [grown]), ("t.py::test_c", [other])))
    assert [line.split()[4] for line in lines if line.startswith("ddp tiny")] == ["5x10", "3x10"]


def test_the_benchmark_export_keeps_a_shared_job_once_with_the_test_that_saw_all_its_runs():
    from pytest_distperf.report.document import TestDocument
    from pytest_distperf.report.files import benchmark_json

    def job(n: int) -> JobRecord:
        runs = [{"step_times": [0.1, 0.2], "peak_memory": 5, "tokens_per_step": 10}] * n
        return job_record(runs, id="job-run-1", label="j", runs=n, step_time=0.15)

    entries = [TestDocument.from_records("t.py::test_a", "passed", 1.0, [job(3)]),
               TestDocument.from_records("t.py::test_b", "passed", 1.0, [job(5)])]
    [bench] = benchmark_json(entries, {"host": "h"})["benchmarks"]
    assert (bench["name"], bench["extra_info"]["runs"]) == ("test_b[j]", 5)


def _one_job_document() -> TestDocument:
    from pytest_distperf.decide.regression import GateContext

    job = JobRecord.from_runs("ddp", [_run([[0.1, 0.2, 0.3], [0.2, 0.1, 0.4]])], {"find_unused_parameters": "True"})
    job.slot_wait_seconds = (0.5,)
    return TestDocument.from_records("t.py::test_a", "passed", 1.0, [job],
                                     GateContext(machine_class="cpu-x2", machine={"device": "cpu"}, environment={}))


def test_the_report_holds_each_job_once_with_its_figures_and_runs():
    doc = _one_job_document()
    report = json.loads(json.dumps(SessionDocument([doc], {}, {}).to_json()))
    [test] = report["tests"]
    assert "runs" not in test and test["machine_class"] == "cpu-x2"
    [job] = test["jobs"]
    assert (job["figures"]["step_time"], len(job["runs"]), job["slot_wait_seconds"]) == (0.2, 1, [0.5])
    assert SessionDocument.from_json(report).tests == [doc]

