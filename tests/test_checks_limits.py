"""A check's limit is checked when its assert_* method is called. distperf.compare() runs the comparison's first
pairs before it returns, so the limit cannot be seen before them (it is an argument of the later call); it is seen
before any further pair is added, and the error says why the jobs ran."""

from __future__ import annotations

import pytest

from pytest_distperf.decide.checks import Adaptive, Comparison, check_limit
from pytest_distperf.errors import UsageError
from pytest_distperf.figures.quantities import JobRuns
from pytest_distperf.rank.results import RankResult, RunResult
from pytest_distperf.spec.job import JobSpec


def _run(step: float) -> RunResult:
    spec = JobSpec(world_size=2, device="cpu", strategy="ddp")
    ranks = [RankResult(rank=r, step_times=[step] * 3, losses=[1.0, 0.9, 0.8], cuda_peak_allocated=None,
                        cuda_peak_reserved=None, host_peak_rss=200, host_rss_before_build=100,
                        optimizer_state_bytes=1200, num_params=100, tokens_per_step=512, build_seconds=0.0,
                        warmup_seconds=0.0) for r in range(2)]
    return RunResult(spec=spec, ranks=ranks, wall_seconds=1.0)


@pytest.mark.parametrize("method,limit", [("assert_step_time_within", -1), ("assert_memory_within", 0),
                                          ("assert_gpu_time_within", float("nan")), ("assert_flops_within", "2"),
                                          ("assert_losses_match", -1e-3)])
def test_a_bad_limit_adds_no_pair_and_says_the_comparison_ran_first(method, limit):
    added = []
    runs_a, runs_b = [_run(0.1) for _ in range(3)], [_run(0.1 + 0.01 * (i % 2)) for i in range(3)]
    cmp = Comparison(JobRuns("A", [runs_a]), JobRuns("B", [runs_b]),
                     adaptive=Adaptive(extend=lambda: added.append(1)))
    with pytest.raises(UsageError) as e:
        getattr(cmp, method)(limit)
    assert str(e.value).startswith(f"Comparison.{method}({limit!r}): expected a finite number")
    assert "after distperf.compare() ran the comparison's first pairs; no further pair was added" in str(e.value)
    assert added == [] and cmp.checks == []  # nothing added, decided or recorded


def test_the_docstring_says_when_the_limit_is_checked():
    doc = " ".join((check_limit.__doc__ or "").split())
    assert "Not before any job" in doc and "before any further pair is added" in doc
    # a probe check's name is given whole: its message is unchanged
    with pytest.raises(UsageError, match=r"^ProbeAssertions.assert_x\(-1\): expected a finite number > 0, got -1$"):
        check_limit("ProbeAssertions.assert_x", -1)
