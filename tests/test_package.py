"""The package as a user installs it: cheap when unused, a public API, one error hierarchy."""

from __future__ import annotations

import pytest

import pytest_distperf
from pytest_distperf import errors


def test_a_session_without_distperf_never_imports_torch(pytester: pytest.Pytester) -> None:
    pytester.makeconftest("""
        import sys
        def pytest_sessionfinish(session):
            heavy = sorted(m for m in ("torch", "deepspeed", "lightning", "accelerate") if m in sys.modules)
            print("HEAVY=" + ",".join(heavy))
    """)
    pytester.makepyfile("def test_unrelated():\n    assert 1 + 1 == 2\n")
    result = pytester.runpytest_subprocess("-s")  # the plugin loads through its entry point
    result.assert_outcomes(passed=1)
    result.stdout.re_match_lines([r".*HEAVY=$"])  # the plugin loaded and stayed light
    result.stdout.fnmatch_lines(["distperf: off*"])


def test_public_api_and_version() -> None:
    assert pytest_distperf.__version__ and pytest_distperf.__version__ != "0.0.0+unknown"
    for name in pytest_distperf.__all__:
        assert getattr(pytest_distperf, name) is not None, name
    with pytest.raises(AttributeError):
        pytest_distperf.no_such_name  # noqa: B018


def test_every_error_is_a_distperf_error_and_every_warning_a_distperf_warning() -> None:
    for name in dir(errors):
        obj = getattr(errors, name)
        if isinstance(obj, type) and issubclass(obj, Warning):
            assert issubclass(obj, errors.DistPerfWarning), name
        elif isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, errors.DistPerfError), name
    # a usage error is still a ValueError and a failed check still an AssertionError, for code that catches those
    assert issubclass(errors.SettingsError, ValueError) and issubclass(errors.DistPerfCheckFailed, AssertionError)


def test_header_says_why_the_device_was_chosen(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--distperf", "--distperf-device=cpu")
    result.stdout.fnmatch_lines(["distperf: device cpu (--distperf-device=cpu); world size 2*",
                                 "distperf: machine class cpu-*-ws2; torch *"])
