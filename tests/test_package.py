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


def test_every_module_outside_the_history_store_imports_without_the_extras() -> None:
    """The extras are optional: with SQLAlchemy, ruptures, DeepSpeed, Lightning and submitit absent, every module
    but the history store and the libraries' own strategy modules imports (the HTML report among them)."""
    import subprocess
    import sys

    code = """
import pkgutil, importlib, sys
for name in ("sqlalchemy", "ruptures", "psycopg", "deepspeed", "lightning", "accelerate", "submitit"):
    sys.modules[name] = None  # import fails as if not installed
import pytest_distperf
# the history store is the history extra; a library's strategy module is imported only for that library's jobs
needs_extra = {"pytest_distperf.store.history.store", "pytest_distperf.store.history.schema",
               "pytest_distperf.strategies.deepspeed", "pytest_distperf.strategies.lightning_fabric",
               "pytest_distperf.strategies.lightning_trainer", "pytest_distperf.strategies.accelerate"}
failed = []
for m in pkgutil.walk_packages(pytest_distperf.__path__, "pytest_distperf."):
    if m.name in needs_extra:
        continue
    try:
        importlib.import_module(m.name)
    except ImportError as e:
        failed.append(f"{m.name}: {e}")
print("\\n".join(failed))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"modules that need an extra to import:\n{out.stdout}"


def test_no_import_runs_back_up_a_layer_and_no_module_cycle() -> None:
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, str(root / "docs" / "design" / "import_layers.py"), str(root)],
                         capture_output=True, text=True, check=True).stdout
    assert "): 0\n" in out.split("module cycles")[0], out.split("module cycles")[0]
    assert "module cycles: 0" in out, out
