"""The default-shape ini keys (distperf_shape_cpu, distperf_shape_cuda) name a built-in shape: another is a usage
error naming the key, before any job (it was a traceback into rank/workload.py from the first job)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pytest_distperf.errors import SettingsError
from pytest_distperf.plugin import _known_shapes as known_shapes
from pytest_distperf.spec.settings import build_settings

KNOWN = "tiny, small, 350m, 1b, 3b, 7b"


@pytest.mark.parametrize("key", ["shape_cpu", "shape_cuda"])
def test_an_unknown_shape_in_the_ini_is_an_error_naming_the_key(key):
    assert ", ".join(known_shapes()) == KNOWN
    with pytest.raises(SettingsError) as e:
        build_settings(True, {}, {key: "huge"}, known_shapes())
    assert str(e.value) == f"ini option distperf_{key}: unknown shape 'huge'; known: {KNOWN}"
    assert getattr(build_settings(True, {}, {key: "small"}, known_shapes()), key) == "small"


def test_without_distperf_the_shapes_are_not_read_and_torch_not_imported():
    code = ("import sys; from pytest_distperf.spec.settings import build_settings; "
            "s = build_settings(False, {}, {'shape_cpu': 'huge'}); print(s.shape_cpu, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["huge", "False"], done.stderr


PERF_TEST = """
import pytest

@pytest.mark.distperf(world_size=2)
def test_x(distperf):
    raise AssertionError("a job would have started here")
"""


def test_a_bad_shape_ini_value_stops_the_session_before_any_job(pytester: pytest.Pytester):
    pytester.makepyfile(test_perf=PERF_TEST)
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider", "-o", "distperf_shape_cpu=huge")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: distperf: ini option distperf_shape_cpu: unknown shape 'huge'; "
                                 f"known: {KNOWN}"])
    assert "a job would have started here" not in result.stdout.str() + result.stderr.str()


def test_an_unknown_shape_given_to_job_is_a_usage_error_naming_the_call(pytester: pytest.Pytester):
    pytester.makepyfile(test_perf="""
import pytest

@pytest.mark.distperf(world_size=1)
def test_x(distperf):
    distperf.job("ddp", shape="huge")
""")
    result = pytester.runpytest("--distperf", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*UsageError: distperf.job(shape='huge', shape_overrides=None): unknown workload "
                                 "shape 'huge'; known shapes: tiny, *"])
