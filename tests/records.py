"""Typed records (report/document.py) for the report tests: a job's figures with every field filled."""

from pytest_distperf.figures.quantities import JobFigures
from pytest_distperf.report.document import JobRecord, TestDocument

FIGURES = dict(label="ddp tiny x2 cpu", device="cpu", config_hash="h", runs=3, steps=10, step_time=0.1,
               run_step_times=(0.1, 0.1, 0.1), run_cv=0.05, step_p10=0.09, step_p90=0.11, peak_memory=float(1 << 20),
               memory_kind="host RSS growth", tokens_per_s=1000.0, optimizer_bytes_per_param=12.0)


def job_record(run_dicts: list | None = None, **figures) -> JobRecord:
    """A job's record with these figures and runs (run_to_dict's dicts; none by default)."""
    return JobRecord(JobFigures(**{**FIGURES, **figures}), "h", {}, list(run_dicts or []))


def documents_of(*tests) -> list[TestDocument]:
    """(nodeid, records) pairs as the passed tests' documents."""
    return [TestDocument.from_records(nodeid, "passed", 1.0, records) for nodeid, records in tests]
