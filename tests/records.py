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


# A 2-rank DDP perf test, as a user writes one: the job tests/conftest.py saves once a session and
# tests/test_regression.py compares against. DP_EXTRA_WORK adds real matmuls to every step (a code change
# slowing it down), DP_REPEATS and DP_STEPS its runs and steps.
DDP_PERF_TEST = """
import os
import pytest

@pytest.mark.distperf(world_size=2)
def test_ddp(distperf):
    # DP_EXTRA_WORK: real extra matmuls inside every step, the way a code change would slow it down
    extra = float(os.environ.get("DP_EXTRA_WORK", "0"))
    distperf.measure("ddp", repeats=int(os.environ.get("DP_REPEATS", "3")), steps=int(os.environ.get("DP_STEPS", "6")),
                     warmup=2, shape_overrides={"extra_work": extra} if extra else None)
"""
