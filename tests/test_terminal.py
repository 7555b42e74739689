"""The terminal's words: the session header (report/header.py) and the undecided summary (report/undecided.py),
built from settings and records alone; no job runs."""

from __future__ import annotations

from pytest_distperf.decide.checks import Check
from pytest_distperf.decide.policy import Policy
from pytest_distperf.decide.verdicts import MetricVerdict
from pytest_distperf.report.document import TestDocument
from pytest_distperf.spec import settings as spec
from pytest_distperf.spec.settings import build_settings

Plan = spec.TestPlan  # under another name: pytest would take TestPlan for a test class


def _verdict(metric: str, status: str, **kw) -> MetricVerdict:
    kind = "count" if metric.endswith("_per_step") else "time"
    v = MetricVerdict(test="t.py::test_x", job="ddp x2 cpu", metric=metric, metric_kind=kind, unit="s",
                      direction="lower", status=status, baseline=0.1, current=0.12, current_runs=3, delta=0.2,
                      low=-0.1, high=0.6, level=0.98, threshold=0.05, **kw)
    return v.landed(Policy())


def test_undecided_verdicts_of_a_failed_test_are_not_said_to_let_it_pass():
    from pytest_distperf.report.undecided import summary_lines

    wall = _verdict("step_time", "inconclusive", stopped="flops_per_step failed")
    flops = _verdict("flops_per_step", "fail")
    failed = TestDocument.from_records("t.py::test_x", "failed", 1.0, [wall, flops])
    lines = summary_lines([failed])
    assert "their tests pass" not in lines[0] and "did not pass for another reason, said under each" in lines[0]
    assert lines[1].endswith("; its test failed on another verdict (flops_per_step of ddp x2 cpu FAIL)"), lines[1]
    # a passed test's: they let it pass, as before
    passed = TestDocument.from_records("t.py::test_y", "passed", 1.0, [_verdict("step_time", "inconclusive")])
    assert summary_lines([passed])[0].endswith("their tests pass (--distperf-strict makes an undecided verdict fail "
                                               "the test)")
    mixed = summary_lines([failed, passed])
    assert "1 of their tests pass, 1 did not for another reason, said under each" in mixed[0]
    assert not mixed[2].endswith("FAIL)")  # the passed test's line says nothing more
    # failed on a check, or on no verdict at all (an exception): said which
    check = Check(name="step_time", a="a", b="b", a_value=1.2, b_value=1.0, ratio=1.2, low=1.15, high=1.25,
                  threshold=1.1, outcome="fail", unit="s")
    on_check = TestDocument.from_records("t.py::test_z", "failed", 1.0, [wall, check])
    assert summary_lines([on_check])[1].endswith("its test failed on another verdict (step_time (a vs b) FAIL)")
    crashed = TestDocument.from_records("t.py::test_w", "failed", 1.0, [wall], failure="RuntimeError: boom")
    assert summary_lines([crashed])[1].endswith("; its test failed (RuntimeError: boom)")
    assert summary_lines([failed], strict=True)[0].endswith("they fail their tests (--distperf-strict)")


def test_the_header_does_not_name_the_default_world_size_as_the_tests():
    """Written before collection: the default world size and its machine class are said as defaults; with the
    selected tests' plans (after collection), their world sizes and classes."""
    from pytest_distperf.report.header import collection_lines, header_lines, machine_classes, world_size_text

    settings = build_settings(True, {}, {})
    lines = header_lines(settings, None)
    assert "tests need 2" not in lines[0] and "world size 2 by default (a test's distperf(world_size=N) sets its " \
        "own)" in lines[0]
    [machine] = [line for line in lines if "machine class" in line]
    assert "-ws2; " in machine and machine.endswith("; that class is world size 2's: a test of another world size "
                                                    "uses its own (...-ws<N>)")
    one = Plan(device="cpu", world_size=1, timeout=900, repeats=3)
    two = Plan(device="cpu", world_size=2, timeout=900, repeats=3)
    skipped = Plan(device=None, world_size=4, timeout=900, repeats=3, skip_reason="no GPUs")
    assert world_size_text(settings, [one, skipped]) == "world size 1"
    assert world_size_text(settings, [one, two]) == "world size 1-2 by test"
    [ws1] = machine_classes(settings, [one])
    assert ws1.endswith("-ws1")
    with_plans = header_lines(settings, None, [one])
    assert "; world size 1;" in with_plans[0] and any(f"machine class {ws1};" in line for line in with_plans)
    [line] = collection_lines(settings, [one, skipped])
    assert line == f"distperf: the 1 selected test to run: world size 1, device cpu; machine class {ws1}"
    both = collection_lines(settings, [one, two, two])[0]
    assert "the 3 selected tests to run: world size 1-2 by test" in both
    assert f"machine classes {ws1} (1 test), {ws1[:-1]}2 (2 tests)" in both
    assert collection_lines(settings, [skipped]) == [] and collection_lines(build_settings(False, {}, {}), [one]) == []
    # the command line's world size is every test's
    forced = build_settings(True, {"world_size": 1}, {})
    assert forced.world_size_override and "tests need 1); world size 1;" in header_lines(forced, None)[0]


def test_after_collection_the_selected_tests_world_sizes_and_machine_classes_are_named(pytester):
    pytester.makepyfile(test_h="""
import pytest

@pytest.mark.distperf(world_size=1)
def test_one(distperf):
    pass

@pytest.mark.distperf(world_size=2)
def test_two(distperf):
    pass
""")
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "--co", "-k", "one")
    result.stdout.fnmatch_lines(["distperf: the 1 selected test to run: world size 1, device cpu; machine class "
                                 "*-ws1"])
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "--co")
    result.stdout.fnmatch_lines(["distperf: the 2 selected tests to run: world size 1-2 by test, device cpu; machine "
                                 "classes *-ws1 (1 test), *-ws2 (1 test)"])
