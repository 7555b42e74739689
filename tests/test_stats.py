"""Ratio arithmetic and the check messages, on plain numbers."""

import math

import pytest

from pytest_distperf.gate.checks import Comparison, DistPerfCheckFailed, SideSummary
from pytest_distperf.spec import JobSpec
from pytest_distperf.results import RankResult, RunResult
from pytest_distperf.measure.stats import max_relative_difference, paired_ratio, quantile, summarize, t95


def test_quantiles_match_linear_interpolation():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert quantile(xs, 0.5) == 3.0
    assert quantile(xs, 0.1) == pytest.approx(1.4)
    s = summarize(xs)
    assert (s.median, s.iqr, s.n) == (3.0, 2.0, 5)


def test_paired_ratio_is_geometric_mean_with_t_interval():
    est = paired_ratio([2.0, 2.2, 1.8], [1.0, 1.0, 1.0])
    logs = [math.log(2.0), math.log(2.2), math.log(1.8)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    assert est.ratio == pytest.approx(math.exp(mean))
    assert est.low == pytest.approx(math.exp(mean - t95(2) * sd / math.sqrt(3)))
    assert est.high == pytest.approx(math.exp(mean + t95(2) * sd / math.sqrt(3)))


def test_pairing_cancels_drift_that_hits_both_sides():
    drift = [1.0, 1.5, 2.0, 2.5]  # the machine slows down over time
    est = paired_ratio([1.2 * d for d in drift], drift)
    assert est.ratio == pytest.approx(1.2) and est.high - est.low == pytest.approx(0.0, abs=1e-9)


def test_one_pair_has_no_interval_and_bad_input_is_rejected():
    assert paired_ratio([2.0], [1.0]).interval_text() == "n/a (1 repeat)"
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_ratio([0.0], [1.0])


def test_max_relative_difference():
    assert max_relative_difference([1.0, 2.0], [1.0, 2.02]) == pytest.approx(0.02 / 2.02)


def _run(label_steps, memory, losses=(1.0, 0.9)):
    spec = JobSpec(world_size=2, device="cpu", strategy="ddp")
    ranks = [RankResult(rank=r, step_times=list(label_steps), losses=list(losses), cuda_peak_allocated=None,
                        cuda_peak_reserved=None, host_peak_rss=memory + 100, host_rss_before_build=100,
                        optimizer_state_bytes=1200, num_params=100, tokens_per_step=512, build_seconds=0.0,
                        warmup_seconds=0.0) for r in range(2)]
    return RunResult(spec=spec, ranks=ranks, wall_seconds=1.0)


def test_step_time_check_passes_and_fails_at_the_threshold():
    a = SideSummary("A", [_run([0.12, 0.12, 0.12], 10), _run([0.12, 0.12, 0.12], 10)])
    b = SideSummary("B", [_run([0.10, 0.10, 0.10], 10), _run([0.10, 0.10, 0.10], 10)])
    cmp = Comparison(a, b)
    assert cmp.assert_step_time_within(1.25).passed
    with pytest.raises(DistPerfCheckFailed) as e:
        cmp.assert_step_time_within(1.1)
    msg = str(e.value)
    assert "1.200x" in msg and "above the 1.10x limit" in msg and "median 120.0 ms" in msg
    assert "median 100.0 ms" in msg and "threshold 1.10" in msg and "2 interleaved pair(s)" in msg
    assert [c.passed for c in cmp.checks] == [True, False]


def test_memory_and_loss_checks():
    a = SideSummary("A", [_run([0.1], 3 << 20, losses=(1.0, 0.9))])
    b = SideSummary("B", [_run([0.1], 2 << 20, losses=(1.0, 0.9001))])
    cmp = Comparison(a, b)
    with pytest.raises(DistPerfCheckFailed, match="peak memory of A is 1.500x B's"):
        cmp.assert_memory_within(1.1)
    assert cmp.assert_losses_match(1e-3).passed
    with pytest.raises(DistPerfCheckFailed, match="losses of A and B differ"):
        cmp.assert_losses_match(1e-6)


def test_slowest_rank_sets_each_step_time():
    run = _run([0.1, 0.1], 0)
    run.ranks[1].step_times = [0.3, 0.05]
    assert run.step_times == [0.3, 0.1]


def test_relative_spread_is_the_gates_run_to_run_variation():
    import statistics

    from pytest_distperf.gate.store import MetricSeries
    from pytest_distperf.measure.stats import relative_spread

    runs = [0.100, 0.110, 0.095]
    assert relative_spread(runs) == pytest.approx(statistics.stdev(math.log(v) for v in runs))
    assert MetricSeries("s", "lower", "time", runs).variation == relative_spread(runs)
    assert relative_spread([0.1]) is None and relative_spread([0.1, 0.0]) is None
