"""Bad numbers are errors at the call that gave them, naming the option, marker argument or keyword and the value,
not crashes deep inside (or in every rank), nor silent passes: NaN, inf, booleans, counts below their least, check
limits; and a loss that goes NaN fails its check."""

import math

import pytest

from pytest_distperf.decide import decision as d
from pytest_distperf.decide.checks import Check, Comparison
from pytest_distperf.errors import DistPerfCheckFailed, SettingsError, UsageError
from pytest_distperf.figures.quantities import JobRuns
from pytest_distperf.figures.stats import first_non_finite, max_relative_difference
from pytest_distperf.rank.results import RankResult, RunResult
from pytest_distperf.spec.job import JobSpec
from pytest_distperf.spec.settings import build_settings, plan_test

NAN, INF = float("nan"), float("inf")


# -- 1. a non-finite loss fails the loss check -------------------------------------------------------------------
def _run(losses, step=0.1):
    spec = JobSpec(world_size=2, device="cpu", strategy="ddp")
    ranks = [RankResult(rank=r, step_times=[step] * 3, losses=list(losses), cuda_peak_allocated=None,
                        cuda_peak_reserved=None, host_peak_rss=200, host_rss_before_build=100,
                        optimizer_state_bytes=1200, num_params=100, tokens_per_step=512, build_seconds=0.0,
                        warmup_seconds=0.0) for r in range(2)]
    return RunResult(spec=spec, ranks=ranks, wall_seconds=1.0)


def _cmp(a_losses, b_losses, added=None):
    """A comparison of these runs' losses; with `added`, adaptive: each pair added is noted there."""
    from pytest_distperf.decide.checks import Adaptive

    runs_a, runs_b = [_run(x) for x in a_losses], [_run(x, step=0.12 if i % 2 else 0.08) for i, x in
                                                   enumerate(b_losses)]

    def one_more_pair():
        added.append(1)
        runs_a.append(_run(a_losses[0]))
        runs_b.append(_run(b_losses[0], step=0.12 if len(runs_b) % 2 else 0.08))

    return Comparison(JobRuns("A", [runs_a]), JobRuns("B", [runs_b]),
                      adaptive=Adaptive(extend=one_more_pair if added is not None else None))


def test_max_relative_difference_does_not_hide_a_nan_after_the_first_step():
    assert math.isnan(max_relative_difference([1.0, NAN, NAN], [1.0, 1.0, 1.0]))  # max() kept 0.0
    assert math.isnan(max_relative_difference([1.0, 1.0], [1.0, NAN]))
    assert not math.isfinite(max_relative_difference([1.0, INF], [1.0, 1.0]))
    assert max_relative_difference([1.0, 2.0], [1.0, 2.02]) == pytest.approx(0.02 / 2.02)
    assert first_non_finite([1.0, 2.0, NAN, INF]) == 2 and first_non_finite([1.0]) is None


@pytest.mark.parametrize("side", ["A", "B"])
def test_a_loss_that_goes_nan_fails_the_loss_check_naming_side_run_and_step(side):
    good, bad = (1.0, 0.9, 0.8), (1.0, 0.9, NAN)
    runs = ([good, bad], [good, good]) if side == "A" else ([good, good], [good, bad])
    cmp = _cmp(*runs)
    with pytest.raises(DistPerfCheckFailed) as e:
        cmp.assert_losses_match(1e-3)
    msg = str(e.value)
    assert "a loss is not finite" in msg and f"{side} ({side}) run 2: loss nan at timed step 3 of 3" in msg
    check = cmp.checks[-1]
    assert check.name == "loss_match" and check.outcome == "fail"
    # the reports' strict JSON has no NaN: null, read back as NaN
    from pytest_distperf.fs.jsonio import dumps

    dumps(check.to_json())
    assert math.isnan(Check.from_json(check.to_json()).ratio)


def test_an_exact_check_never_passes_on_a_nan():
    for direction in d.DIRECTIONS:
        assert d.decide(d.exact(NAN), 1.1, direction).outcome == d.FAIL
    assert d.decide(d.exact(1.0), 1.1).outcome == d.PASS  # unchanged


# -- 2. NaN, inf and booleans are no positive numbers; repeats above max_repeats ----------------------------------
@pytest.mark.parametrize("cli,ini,needle", [
    ({"timeout": "nan"}, {}, "--distperf-timeout: expected a positive number, got 'nan'"),
    ({"timeout": "inf"}, {}, "--distperf-timeout: expected a positive number, got 'inf'"),
    ({"session_budget": "nan"}, {}, "--distperf-session-budget: expected a positive number, got 'nan'"),
    ({}, {"timeout": "nan"}, "ini option distperf_timeout: expected a positive number, got 'nan'"),
    ({}, {"test_budget": "NaN"}, "ini option distperf_test_budget: expected a positive number"),
    ({"repeats": "inf"}, {}, "--distperf-repeats: expected a positive integer, got 'inf'"),
    ({"world_size": True}, {}, "--distperf-world-size: expected a positive integer, got True"),
])
def test_non_finite_and_boolean_settings_are_errors_naming_the_option(cli, ini, needle):
    with pytest.raises(SettingsError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        build_settings(True, cli, ini)


@pytest.mark.parametrize("marker,needle", [
    ({"timeout": NAN}, "t.py::x: distperf(timeout=...): expected a positive number, got nan"),
    ({"test_budget": NAN}, "t.py::x: distperf(test_budget=...): expected a positive number, got nan"),
    ({"test_budget": INF}, "t.py::x: distperf(test_budget=...): expected a positive number, got inf"),
    ({"world_size": True}, "t.py::x: distperf(world_size=...): expected a positive integer, got True"),
    ({"repeats": 1e400}, "t.py::x: distperf(repeats=...): expected a positive integer, got inf"),
])
def test_non_finite_and_boolean_marker_arguments_are_errors_naming_them(marker, needle):
    with pytest.raises(SettingsError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        plan_test(build_settings(True, {}, {}), marker, gpus=0, where="t.py::x")


def test_repeats_given_above_max_repeats_is_an_error_naming_both():
    with pytest.raises(SettingsError, match=r"t.py::x: distperf\(repeats=5\) is more than distperf\(max_repeats=2\)"):
        plan_test(build_settings(True, {}, {}), {"repeats": 5, "max_repeats": 2}, gpus=0, where="t.py::x")
    with pytest.raises(SettingsError, match="--distperf-repeats=5 is more than --distperf-max-repeats=2"):
        build_settings(True, {"repeats": "5", "max_repeats": "2"}, {})
    with pytest.raises(SettingsError, match="ini option distperf_repeats=13 is more than default "
                                            "distperf_max_repeats=12"):
        build_settings(True, {}, {"repeats": "13"})
    with pytest.raises(SettingsError, match=r"t.py::x: --distperf-repeats=5 is more than distperf\(max_repeats=4\)"):
        plan_test(build_settings(True, {"repeats": "5"}, {}), {"max_repeats": 4}, gpus=0, where="t.py::x")
    # the default repeats still shrink to a smaller max_repeats (the budget bounds the first look)
    assert build_settings(True, {"max_repeats": "2"}, {}).repeats == 2
    assert plan_test(build_settings(True, {}, {}), {"max_repeats": 2}, gpus=0, where="t.py::x").repeats == 2
    assert plan_test(build_settings(True, {}, {}), {"repeats": 4, "max_repeats": 4}, gpus=0, where="x").repeats == 4


# -- 3. the fixture's verbs check their counts at the call ------------------------------------------------------
def make_step():  # a step factory (never called here)
    return lambda: None


@pytest.fixture
def dp():
    from pytest_distperf.fixture import DistPerf
    from pytest_distperf.session import SessionLedger
    from pytest_distperf.spec.settings import TestPlan

    plan = TestPlan(device="cpu", world_size=2, timeout=60.0, repeats=3)
    return DistPerf(build_settings(True, {}, {}), plan, SessionLedger(), "t.py::test_x", "/tmp")


@pytest.mark.parametrize("verb,kwargs,needle", [
    ("job", dict(steps=0), "distperf.job(steps=...) must be an integer of at least 1, got 0"),
    ("job", dict(warmup=-1), "distperf.job(warmup=...) must be an integer of at least 0, got -1"),
    ("job", dict(steps=2.5), "distperf.job(steps=...) must be an integer of at least 1, got 2.5"),
    ("job", dict(world_size=0), "distperf.job(world_size=...) must be an integer of at least 1, got 0"),
    ("job", dict(world_size=True), "distperf.job(world_size=...) must be an integer of at least 1, got True"),
    ("job", dict(probe_steps=0), "distperf.job(probe_steps=...) must be an integer of at least 1, got 0"),
    ("step_job", dict(steps=0), "distperf.step_job(steps=...) must be an integer of at least 1, got 0"),
    ("step_job", dict(warmup=-1), "distperf.step_job(warmup=...) must be an integer of at least 0, got -1"),
    ("step_job", dict(steps="10"), "distperf.step_job(steps=...) must be an integer of at least 1, got '10'"),
    ("script_job", dict(steps=0), "distperf.script_job(steps=...) must be an integer of at least 1, got 0"),
    ("script_job", dict(warmup="3"), "distperf.script_job(warmup='3')"),
])
def test_the_verbs_reject_bad_counts_at_the_call(dp, tmp_path, verb, kwargs, needle):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    first = {"job": "ddp", "step_job": make_step, "script_job": str(script)}[verb]
    with pytest.raises(UsageError, match=needle.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        getattr(dp, verb)(first, **kwargs)


def test_the_verbs_take_good_counts(dp):
    job = dp.job("ddp", steps=1, warmup=0, world_size=1)
    assert (job.steps, job.warmup_steps, job.world_size) == (1, 0, 1)
    assert dp.step_job(make_step, steps=2).world_size == 2  # the test's


def test_run_function_checks_its_world_size(dp):
    with pytest.raises(UsageError, match=r"distperf\.run_function\(world_size=\.\.\.\) must be an integer of at "
                                         r"least 1, got 0"):
        dp.run_function(make_step, world_size=0)


# -- 4. check limits are checked before any pair is run ---------------------------------------------------------
@pytest.mark.parametrize("method,limit,needle", [
    ("assert_step_time_within", NAN, "Comparison.assert_step_time_within(nan): expected a finite number > 0"),
    ("assert_step_time_within", "1.1", "Comparison.assert_step_time_within('1.1'): expected a finite number > 0"),
    ("assert_step_time_within", 0, "Comparison.assert_step_time_within(0)"),
    ("assert_memory_within", INF, "Comparison.assert_memory_within(inf)"),
    ("assert_gpu_time_within", -1.0, "Comparison.assert_gpu_time_within(-1.0)"),
    ("assert_flops_within", True, "Comparison.assert_flops_within(True)"),
    ("assert_losses_match", -1, "Comparison.assert_losses_match(-1): expected a finite number >= 0"),
    ("assert_losses_match", NAN, "Comparison.assert_losses_match(nan)"),
])
def test_check_limits_are_usage_errors_before_any_pair(method, limit, needle):
    added: list = []
    cmp = _cmp([(1.0, 0.9)] * 3, [(1.0, 0.9)] * 3, added)
    with pytest.raises(UsageError, match=needle.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        getattr(cmp, method)(limit)
    assert added == [] and cmp.checks == []
    assert cmp.assert_losses_match(0).passed  # the same curves: a tolerance of 0 is a limit


# -- 5. a stored-baseline verdict stops at "max N runs", a comparison at "max N pairs" ----------------------------
def test_the_stop_reason_counts_runs_for_the_unpaired_gate_and_pairs_for_comparisons():
    from pytest_distperf.decide.stopping import Budget, Clock, stop_reason, until_decided

    assert stop_reason(6, Budget(max_pairs=6), Clock()) == "max 6 pairs"
    assert stop_reason(6, Budget(max_pairs=6), Clock(), unit="runs") == "max 6 runs"
    stored = [1.0, 1.3, 0.8, 1.2, 0.9, 1.1]
    cand = [1.05, 1.3, 0.85]

    def add():
        cand.append(cand[len(cand) % 3])

    v = until_decided(lambda: d.decide(d.unpaired(cand, stored, Design6), 1.0), add, Budget(max_pairs=6))
    assert v.outcome == d.INCONCLUSIVE and v.stopped == "max 6 runs"
    a, b = [1.0, 1.3, 0.8], [1.0, 1.0, 1.0]

    def add_pair():
        a.append(a[len(a) % 3])
        b.append(1.0)

    v = until_decided(lambda: d.decide(d.paired(a, b, Design6), 1.0), add_pair, Budget(max_pairs=6))
    assert v.outcome == d.INCONCLUSIVE and v.stopped == "max 6 pairs"


Design6 = d.Design(max_pairs=6)


@pytest.mark.parametrize("call, needle", [
    (lambda p: p.assert_collectives_within("all_gather", NAN), "ProbeAssertions.assert_collectives_within(nan)"),
    (lambda p: p.assert_overlap_at_least(-0.5), "ProbeAssertions.assert_overlap_at_least(-0.5)"),
    (lambda p: p.assert_copy_bytes_within("DtoH", 1e6, "2"), "ProbeAssertions.assert_copy_bytes_within('2')"),
])
def test_probe_check_limits_are_usage_errors_at_the_call(call, needle):
    from pytest_distperf.decide.probe_checks import ProbeAssertions

    with pytest.raises(UsageError, match=needle.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        call(ProbeAssertions.__new__(ProbeAssertions))  # the limit is checked first: no probed run needed
