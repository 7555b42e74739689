"""Statistics over plain numbers, the checks between strategies and their messages (the intervals
themselves are tested in test_decision.py)."""

import math

import pytest

from pytest_distperf.errors import DistPerfInconclusive
from pytest_distperf.decide.checks import Comparison, DistPerfCheckFailed
from pytest_distperf.figures.quantities import JobRuns
from pytest_distperf.spec.job import JobSpec
from pytest_distperf.rank.results import RankResult, RunResult
from pytest_distperf.figures.stats import max_relative_difference, quantile


def test_quantiles_match_linear_interpolation():
    xs = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert quantile(xs, 0.5) == 3.0
    assert quantile(xs, 0.1) == pytest.approx(1.4)


def test_max_relative_difference():
    assert max_relative_difference([1.0, 2.0], [1.0, 2.02]) == pytest.approx(0.02 / 2.02)


def _run(label_steps, memory, losses=(1.0, 0.9), device="cpu", state=None):
    """A 2-rank run: `memory` is the host RSS growth (CPU) or the CUDA peak allocated; `state`, the training
    state's bytes of the work phase (CPU; a step's allocation peak of 1 MiB on top), None: no work phase."""
    from pytest_distperf.rank.results import WorkResult

    spec = JobSpec(world_size=2, device=device, strategy="ddp")
    work = None if state is None else WorkResult(steps=2, state_bytes=state - (1 << 20), step_peak_bytes=[1 << 20] * 2)
    cuda = device == "cuda"
    ranks = [RankResult(rank=r, step_times=list(label_steps), losses=list(losses),
                        cuda_peak_allocated=memory if cuda else None, cuda_peak_reserved=None,
                        host_peak_rss=(0 if cuda else memory) + 100, host_rss_before_build=100,
                        optimizer_state_bytes=1200, num_params=100, tokens_per_step=512, build_seconds=0.0,
                        warmup_seconds=0.0, work=work) for r in range(2)]
    return RunResult(spec=spec, ranks=ranks, wall_seconds=1.0)


def test_step_time_check_passes_and_fails_at_the_threshold():
    # Identical pair ratios: a pair-to-pair variation of zero, so the interval is the ratio itself.
    a = JobRuns("A", [[_run([0.12, 0.12, 0.12], 10), _run([0.12, 0.12, 0.12], 10)]])
    b = JobRuns("B", [[_run([0.10, 0.10, 0.10], 10), _run([0.10, 0.10, 0.10], 10)]])
    cmp = Comparison(a, b)
    assert cmp.assert_step_time_within(1.25).passed
    with pytest.raises(DistPerfCheckFailed) as e:
        cmp.assert_step_time_within(1.1)
    msg = str(e.value)
    assert "1.200x" in msg and "above the 1.10x limit" in msg and "step time 120.0 ms" in msg
    assert "step time 100.0 ms" in msg and "limit 1.10" in msg and "2 interleaved pair(s)" in msg
    assert [c.outcome for c in cmp.checks] == ["pass", "fail"]


def test_a_check_whose_interval_holds_the_limit_is_inconclusive_not_failed():
    # 1.121 [0.887, 1.418] failed the old point-estimate check at 1.1; its interval holds both 1.0 and 1.1.
    a = JobRuns("A", [[_run([t], 10) for t in (0.13, 0.10, 0.12)]])
    b = JobRuns("B", [[_run([0.10], 10) for _ in range(3)]])
    with pytest.warns(DistPerfInconclusive, match=r"inconclusive, 1\.\d+x with the 98% interval"):
        check = Comparison(a, b).assert_step_time_within(1.1)
    assert check.outcome == "inconclusive" and check.low < 1.1 < check.high and check.stopped == "fixed runs"


def test_an_inconclusive_check_runs_more_pairs_until_decided():
    runs_a, runs_b = [_run([t], 10) for t in (0.13, 0.10, 0.12)], [_run([0.10], 10) for _ in range(3)]
    a, b = JobRuns("A", [runs_a]), JobRuns("B", [runs_b])  # each side reads its list as it grows
    progress = []

    def one_more_pair():
        runs_a.append(_run([0.30], 10))
        runs_b.append(_run([0.10], 10))

    from pytest_distperf.decide.checks import Adaptive

    cmp = Comparison(a, b, adaptive=Adaptive(extend=one_more_pair, progress=progress.append))
    with pytest.raises(DistPerfCheckFailed):
        cmp.assert_step_time_within(1.1)
    assert progress[0].startswith("step time: inconclusive after 3 pairs (") and progress[0].endswith(
        "vs 1.10), running pairs 4-6 for the look at 6")  # the design looks at planned pair counts (3, 6, 12)
    assert cmp.checks[0].outcome == "fail" and cmp.checks[0].pairs == len(a.runs) > 3


def test_memory_and_loss_checks():
    # CUDA: the memory check decides on the CUDA peak allocated, and is named after it
    a = JobRuns("A", [[_run([0.1], 3 << 20, losses=(1.0, 0.9), device="cuda") for _ in range(2)]])
    b = JobRuns("B", [[_run([0.1], 2 << 20, losses=(1.0, 0.9001), device="cuda"),
                       _run([0.1], 2 << 20, losses=(1.0, 0.9), device="cuda")]])
    cmp = Comparison(a, b)
    with pytest.raises(DistPerfCheckFailed, match="peak memory of A is 1.500x B's") as e:
        cmp.assert_memory_within(1.1)
    assert "CUDA peak allocated 3.00 MiB" in str(e.value) and "host RSS" not in str(e.value)
    assert cmp.checks[-1].name == "peak_memory" and cmp.checks[-1].secondary == ""
    assert cmp.assert_losses_match(1e-3).passed
    # every run of A against every run of B: B's first run is the one that differs
    with pytest.raises(DistPerfCheckFailed, match=r"losses of A and B differ .* A run 1, B run 1"):
        cmp.assert_losses_match(1e-6)


def test_on_cpu_the_memory_check_decides_on_the_training_state_and_shows_host_rss_beside_it():
    """Host RSS growth counts what a rank imports and a library's one-time allocations: A's RSS grows 3x B's while
    both hold the same training state. The check passes on the training state, is named after it, and says the RSS
    figures beside it; where the training state differs, it fails on that, with RSS still shown, not deciding."""
    from pytest_distperf.decide.checks import Check

    def side(label, rss, state):
        return JobRuns(label, [[_run([0.1], rss, state=state), _run([0.1], rss, state=state)]])

    cmp = Comparison(side("A", 90 << 20, 30 << 20), side("B", 30 << 20, 30 << 20))
    check = cmp.assert_memory_within(1.1)
    assert check.passed and check.name == "train_memory" and check.ratio == pytest.approx(1.0)
    assert (check.a_value, check.b_value) == pytest.approx((30 << 20, 30 << 20))
    assert check.secondary.startswith("host RSS growth during training (peak_memory; shown, not decided on")
    assert "A 90.00 MiB, B 30.00 MiB, 3.000x" in check.secondary
    assert Check.from_json(check.to_json()) == check  # the reports carry it

    cmp = Comparison(side("A", 30 << 20, 45 << 20), side("B", 30 << 20, 30 << 20))
    with pytest.raises(DistPerfCheckFailed) as e:
        cmp.assert_memory_within(1.1)
    msg = str(e.value)
    assert msg.startswith("training-state memory (train_memory) of A is 1.500x B's, above the 1.10x limit")
    assert "A A: training state (parameters, gradients, optimizer state + a step's allocation peak) 45.00 MiB" in msg
    assert "host RSS growth during training (peak_memory; shown, not decided on" in msg and "1.000x" in msg

    # no training state measured (a CPU job without a work phase): skipped with the reason, never decided on RSS
    from _pytest.outcomes import Skipped

    with pytest.raises(Skipped, match="train_memory of A: the job ran no work phase"):
        Comparison(side("A", 90 << 20, None), side("B", 30 << 20, None)).assert_memory_within(1.1)


def test_slowest_rank_sets_each_step_time():
    run = _run([0.1, 0.1], 0)
    run.ranks[1].step_times = [0.3, 0.05]
    assert run.step_times == [0.3, 0.1]


def test_relative_spread_is_the_gates_run_to_run_variation():
    import statistics

    from pytest_distperf.store.baselines import MetricSeries
    from pytest_distperf.figures.stats import relative_spread

    runs = [0.100, 0.110, 0.095]
    assert relative_spread(runs) == pytest.approx(statistics.stdev(math.log(v) for v in runs))
    assert MetricSeries("s", "lower", "time", runs).variation == relative_spread(runs)
    assert relative_spread([0.1]) is None and relative_spread([0.1, 0.0]) is None


def test_a_jobs_figures_have_one_definition():
    from pytest_distperf.figures.quantities import geometric_mean, job_figures

    runs = [_run([0.10, 0.12, 0.11], 10 << 20), _run([0.20, 0.21, 0.22], 30 << 20)]
    f = job_figures("A", runs)
    assert f.run_step_times == (0.11, 0.21)  # the median of each run's steps (slowest rank per step)
    assert f.step_time == pytest.approx(math.sqrt(0.11 * 0.21)) == geometric_mean([0.11, 0.21])
    assert f.peak_memory == pytest.approx(math.sqrt(10 * 30) * (1 << 20))
    assert f.tokens_per_s == pytest.approx(512 / f.step_time)
    from pytest_distperf.figures.quantities import JobFigures

    assert JobFigures.from_json(f.to_json()) == f
    # a comparison's ratio is the ratio of the two jobs' figures
    b = [_run([0.05], 10 << 20), _run([0.10], 10 << 20)]
    est = Comparison(JobRuns("A", [runs]), JobRuns("B", [b])).step_time_ratio
    assert est.ratio == pytest.approx(f.step_time / job_figures("B", b).step_time)


def test_what_an_inconclusive_check_does_in_a_test():
    from _pytest.outcomes import Failed, Skipped

    from pytest_distperf.spec.settings import TestPlan, build_settings
    from pytest_distperf.fixture import DistPerf
    from pytest_distperf.session import SessionLedger

    a = JobRuns("A", [[_run([t], 10) for t in (0.13, 0.10, 0.12)]])
    b = JobRuns("B", [[_run([0.10], 10) for _ in range(3)]])

    def fixture(strict: bool, known_gap: str | None) -> DistPerf:
        settings = build_settings(True, {"strict": strict}, {})
        plan = TestPlan(device="cpu", world_size=2, timeout=60.0, repeats=3, known_gap=known_gap)
        return DistPerf(settings, plan, SessionLedger(), "t.py::test_x", "/tmp")

    def check(dp: DistPerf):
        from pytest_distperf.decide.checks import Adaptive

        return Comparison(a, b, on_check=dp._record_check,
                          adaptive=Adaptive(on_inconclusive=dp._inconclusive)).assert_step_time_within(1.1)

    dp = fixture(strict=False, known_gap=None)
    with pytest.warns(DistPerfInconclusive):  # a warning; the test goes on
        assert check(dp).outcome == "inconclusive"
    assert dp.records[-1].outcome == "inconclusive"
    with pytest.warns(DistPerfInconclusive), pytest.raises(Failed, match="--distperf-strict"):
        check(fixture(strict=True, known_gap=None))
    # a known gap: only a FAIL satisfies its strict xfail; undecided, the test skips
    with pytest.warns(DistPerfInconclusive), pytest.raises(Skipped, match="neither confirmed nor refuted"):
        check(fixture(strict=False, known_gap="upstream#1: 1.3x"))


def test_the_flops_check_decides_on_the_counts_of_the_runs_that_measured_them():
    """Exact counts are measured in a job's first run of a session only: the check reads that run's, where a skip
    "no work phase" would be false."""
    from pytest_distperf.rank.results import WorkResult

    def side(label, flops):
        runs = [_run([0.1], 1 << 20, state=30 << 20) for _ in range(3)]
        for r in runs[0].ranks:
            r.work = WorkResult(steps=2, flops=[flops] * 2, state_bytes=r.work.state_bytes,
                                step_peak_bytes=r.work.step_peak_bytes)
        return JobRuns(label, [runs])

    cmp = Comparison(side("A", 2_200), side("B", 2_000))
    assert cmp.assert_flops_within(1.1).passed
    with pytest.raises(DistPerfCheckFailed, match=r"FLOPs per step of A are 1\.1000x B's"):
        cmp.assert_flops_within(1.05)
