"""A gate that cannot go quiet: a test finds its baseline whatever rootdir pytest infers, a missing one in a
folder full of others is said loudly, and a stored number that is not a measurement fails at setup."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pytest_distperf.errors import BaselineError
from pytest_distperf.launch import fingerprint
from pytest_distperf.store.baselines import Store, file_name_for, parse

GATE_TEST = """
import json
import pathlib

import pytest

@pytest.mark.distperf(world_size=2, repeats=1)
def {name}(distperf):
    if {run_job}:
        distperf.run("ddp", steps=2, warmup=1)
    gate = distperf.gate
    pathlib.Path({out!r}).write_text(json.dumps({{"path": gate.path, "found": gate.baseline is not None}}))
"""


def _write_test(folder: Path, out: Path, run_job: bool, name: str = "test_step") -> None:
    (folder / "test_gate.py").write_text(GATE_TEST.format(name=name, run_job=run_job, out=str(out)))


def _seen(out: Path) -> dict:
    return json.loads(out.read_text())


# Saving records each job up to the adaptive budget (--distperf-max-repeats); 3 keeps these tests quick.
FAST = ("-p", "no:cacheprovider", "--distperf-max-repeats=3")


def _rootdir(result: pytest.RunResult) -> str:
    return next(line.split(":", 1)[1].strip() for line in result.outlines if line.startswith("rootdir:"))


@pytest.fixture
def project(pytester, monkeypatch):
    """A user project without a pytest ini file: tests/ holds the test, pytest runs from the project folder."""
    root = pytester.mkdir("proj")
    (root / "tests").mkdir()
    monkeypatch.chdir(root)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("stray", ["baselines-option", "leftover-json-report"])
def test_the_same_baseline_is_found_with_and_without_a_stray_path_argument(pytester, project, stray):
    out = pytester.path / "seen.json"
    elsewhere = pytester.mkdir("elsewhere")  # outside the test folder: pytest takes it for a test path
    if stray == "baselines-option":
        folder = elsewhere / "perf-baselines"
        folder.mkdir()
        plain, spaced = [f"--distperf-baselines={folder}"], ["--distperf-baselines", str(folder)]
    else:
        report = elsewhere / "old-report.json"
        report.write_text("{}")  # left over from an earlier run
        plain, spaced = [f"--distperf-json={report}"], ["--distperf-json", str(report)]

    _write_test(project / "tests", out, run_job=True)
    saved = pytester.runpytest("--distperf", "--distperf-save", *plain, "tests", *FAST)
    saved.assert_outcomes(passed=1)
    first = _seen(out)
    assert os.path.isfile(first["path"])

    _write_test(project / "tests", out, run_job=False)  # same file and test name: only the lookup runs
    straying = pytester.runpytest("--distperf", *spaced, "tests", *FAST)
    straying.assert_outcomes(passed=1)
    assert _rootdir(straying) != _rootdir(saved)  # the stray path did move the rootdir (pytest-dev/pytest#8846)
    assert _seen(out) == {"path": first["path"], "found": True}

    again = pytester.runpytest("--distperf", *plain, "tests", *FAST)
    again.assert_outcomes(passed=1)
    assert _seen(out) == {"path": first["path"], "found": True}


@pytest.mark.slow
def test_a_renamed_test_is_said_loudly_and_fails_when_a_baseline_is_required(pytester, project):
    out = pytester.path / "seen.json"
    _write_test(project / "tests", out, run_job=True)
    pytester.runpytest("--distperf", "--distperf-save", "tests", *FAST).assert_outcomes(passed=1)
    saved = Path(_seen(out)["path"])

    _write_test(project / "tests", out, run_job=True, name="test_step_renamed")
    result = pytester.runpytest("--distperf", "--distperf-require-baseline", "tests", *FAST)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([f"*holds 1 other baseline(s)*{saved.name}*renamed or moved*"])
    result.stdout.fnmatch_lines(["*BaselineUnmatchedWarning*"])

    quiet = pytester.runpytest("--distperf", "tests", *FAST)  # without the option: a warning
    quiet.assert_outcomes(passed=1)
    quiet.stdout.fnmatch_lines(["*BaselineUnmatchedWarning*no baseline file*renamed or moved*"])


# -- the key and stored numbers, without jobs ------------------------------------------------------------------
def test_the_key_is_the_test_file_from_the_project_root(tmp_path):
    store = Store(str(tmp_path / "baselines"))
    test_file = tmp_path / "perf_tests" / "test_zero3.py"
    for nodeid in ("perf_tests/test_zero3.py::test_x", "test_zero3.py::test_x", "proj/perf_tests/test_zero3.py::test_x"):
        assert store.key_for(str(test_file), nodeid) == "perf_tests/test_zero3.py::test_x"
    assert store.key_for(str(test_file), "x.py::TestA::test_b[1-2]") == "perf_tests/test_zero3.py::TestA::test_b[1-2]"


def _doc(**metric) -> dict:
    series = {"unit": "s", "direction": "lower", "kind": "time", "runs": [0.1, 0.11, 0.12], "samples": None,
              "summary": {"n": 3, "median": 0.11, "min": 0.1, "max": 0.12, "variation": 0.09}}
    series.update(metric)
    return {"format_version": 1, "test": "perf_tests/test_zero3.py::test_x", "machine_class": "cpu-x",
            "machine": {}, "environment": {}, "saved_at": "",
            "jobs": {"ddp tiny x2 cpu": {"config_hash": "abc", "config": {}, "metrics": {"step_time": series}}}}


def test_a_file_is_read_under_the_key_of_the_usual_layout(tmp_path):
    baseline = parse(_doc(), "b.json")
    assert baseline.test == "perf_tests/test_zero3.py::test_x"
    store = Store(str(tmp_path / "baselines"))
    assert file_name_for(store.key_for(str(tmp_path / "perf_tests" / "test_zero3.py"), baseline.test)) == \
        "perf_tests.test_zero3--test_x.json"


@pytest.mark.parametrize("change,where", [
    ({"summary": {"n": 3, "median": float("nan"), "min": 0.1, "max": 0.12, "variation": 0.09}}, "summary']['median"),
    ({"summary": {"n": 3, "median": 0.11, "min": -0.1, "max": 0.12, "variation": None}}, "summary.min"),
    ({"runs": [0.1, float("inf"), 0.12]}, "runs'][1]"),
    ({"runs": [0.1, -0.11, 0.12]}, "runs[1]"),
    ({"runs": [0.1, 0.0, 0.12]}, "runs[1]"),
    ({"samples": [[0.1, -1.0]]}, "samples[0][1]"),
])
def test_a_stored_number_that_is_no_measurement_names_the_file_and_the_place(change, where):
    with pytest.raises(BaselineError) as e:
        parse(json.loads(json.dumps(_doc(**change))), "baselines/cpu-x/b.json")
    assert "baselines/cpu-x/b.json" in str(e.value) and where in str(e.value), str(e.value)


def test_nan_in_a_stored_summary_fails_the_test_at_setup(pytester):
    """A file on disk with NaN (which Python's JSON reader accepts): the test fails before any job starts."""
    pytester.makepyfile(test_nan="""
        import pytest

        @pytest.mark.distperf(world_size=2)
        def test_x(distperf):
            raise AssertionError("the body must not run")
    """)
    machine_class = fingerprint.machine_class("cpu", 2).name
    doc = _doc()
    doc["test"] = "test_nan.py::test_x"
    folder = pytester.path / "baselines" / machine_class
    folder.mkdir(parents=True)
    text = json.dumps(doc).replace('"median": 0.11', '"median": NaN')
    (folder / "test_nan--test_x.json").write_text(text)
    result = pytester.runpytest("--distperf", *FAST)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*test_nan--test_x.json: holds a non-finite number*summary*median*"])
    assert "the body must not run" not in result.stdout.str()
    assert (folder / "test_nan--test_x.json").read_text() == text  # left as it was


def test_with_a_fixed_rootdir_the_key_is_relative_to_it(tmp_path):
    """An ini file fixes the rootdir: a baselines folder deeper down (`perf/baselines`) keeps the usual keys."""
    store = Store(str(tmp_path / "perf" / "baselines"), str(tmp_path))
    key = store.key_for(str(tmp_path / "perf_tests" / "test_zero3.py"), "perf_tests/test_zero3.py::test_x")
    assert key == "perf_tests/test_zero3.py::test_x"
    assert file_name_for(key) == "perf_tests.test_zero3--test_x.json"
